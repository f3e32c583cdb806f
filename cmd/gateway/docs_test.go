package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// Every gateway flag, and its environment variable, is documented in one
// row of docs/deploy.md's flag table, as the code defines them.
func TestDocs_GatewayFlags(t *testing.T) {
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `--") {
			rows = append(rows, l)
		}
	}
	n := 0
	flagSet(&settings{clusters: clusterFlag{}}).VisitAll(func(f *flag.Flag) {
		n++
		for _, r := range rows {
			// The flag's own row names it in its first cell; others may
			// name it in their text.
			if first := strings.SplitN(r, "|", 3)[1]; strings.Contains(first, "`--"+f.Name+"`") || strings.Contains(first, "`--"+f.Name+" ") {
				if !strings.Contains(r, "`"+envName(f.Name)+"`") {
					t.Errorf("docs/deploy.md documents --%s without its variable %s: %s", f.Name, envName(f.Name), r)
				}
				return
			}
		}
		t.Errorf("docs/deploy.md has no table row for --%s", f.Name)
	})
	if n < 12 {
		t.Errorf("only %d flags seen", n)
	}
}
