// Command fuzzlist prints every fuzz target of the module as
// "./pkg:FuzzName", one per line, for `make test-fuzz`: go test -fuzz takes
// one target of one package at a time. With -quick, a target that make
// test fuzzes for fewer inputs than the rest gets its count too:
// "./pkg:FuzzName:400x".
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var fuzzFunc = regexp.MustCompile(`^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

// quickCounts are the inputs make test fuzzes a target for when it is far
// dearer than the rest. FuzzServer_H2C holds each input's conversation
// with two HTTP/2 servers over loopback, whose coverage varies from run
// to run with their goroutines, so that under the fuzzing engine nearly
// every input is "new" and is sent back and stored: 2,000 inputs took 34
// s of CPU, a fifth of everything make test fuzzes (about 1.7 ms an
// input outside the engine). Fuzzing for longer (FUZZTIME) runs it as
// the others.
var quickCounts = map[string]string{"FuzzServer_H2C": "400x"}

func main() {
	quick := flag.Bool("quick", false, "append the counts of targets make test fuzzes for fewer inputs")
	flag.Parse()
	var out []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "build") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if m := fuzzFunc.FindStringSubmatch(sc.Text()); m != nil {
				spec := "./" + filepath.Dir(path) + ":" + m[1]
				if n, ok := quickCounts[m[1]]; ok && *quick {
					spec += ":" + n
				}
				out = append(out, spec)
			}
		}
		return sc.Err()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fuzzlist:", err)
		os.Exit(1)
	}
	sort.Strings(out)
	for _, s := range out {
		fmt.Println(s)
	}
}
