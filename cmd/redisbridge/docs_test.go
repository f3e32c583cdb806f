package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/redisbridge"
)

// Every bridge flag, and its environment variable, is documented in one
// row of docs/bridge.md's settings table. Both come from the bridge's code:
// the flags from its usage text, the variables from what ParseSettings
// looks up, so a renamed or new flag fails here until the docs follow.
func TestDocs_BridgeFlags(t *testing.T) {
	doc, err := os.ReadFile("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `--") {
			rows = append(rows, l)
		}
	}
	var usage bytes.Buffer
	redisbridge.Usage(&usage)
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		flags = append(flags, m[1])
	}
	// ParseSettings asks for each flag's variable, in flag name order, as
	// the usage text lists the flags.
	var envs []string
	redisbridge.ParseSettings(nil, func(name string) string {
		envs = append(envs, name)
		return ""
	})
	if len(flags) < 10 || len(envs) != len(flags) {
		t.Fatalf("%d flags in the usage text, %d variables looked up", len(flags), len(envs))
	}
	for i, f := range flags {
		row := ""
		for _, r := range rows {
			// The flag's own row names it in its first cell; others may
			// name it in their text.
			if first := strings.SplitN(r, "|", 3)[1]; strings.Contains(first, "`--"+f+"`") {
				row = r
			}
		}
		if row == "" {
			t.Errorf("docs/bridge.md has no table row for --%s", f)
		} else if !strings.Contains(row, "`"+envs[i]+"`") {
			t.Errorf("docs/bridge.md documents --%s without its variable %s: %s", f, envs[i], row)
		}
	}
}
