// Command fuzzrun fuzzes every fuzz target of the module briefly, for
// `make test-fuzz`: each target from its seeds for a count of inputs.
//
// go test -fuzz takes one target of one package at a time, and each call
// links the package's instrumented test binary again: 40 targets in 16
// packages were 40 links, most of the phase's CPU. fuzzrun builds each
// package's binary once (go test -c -fuzz, which instruments as go test
// -fuzz does) and runs every target from it, in the package's directory
// as go test would (a failing input is written under its testdata/fuzz),
// with the flags go test passes.
//
// Each target starts from its seeds alone, with its own empty cache of
// interesting inputs under -cache: in the shared one ($GOCACHE/fuzz)
// every run adds inputs that every later run replays first, one at a
// time, within the same count: the phase slowed from 30 s to 63 s on a
// machine that had run it for a day. Fuzzing by hand with go test -fuzz keeps using
// the shared cache.
//
// Inputs are not minimized (-test.fuzzminimizetime=0): a worker still
// minimizing a new input when the count runs out is stopped, and Go
// 1.26's coordinator then reports "fuzzing process hung or terminated
// unexpectedly while minimizing: EOF" with an input that passes
// (go.dev/issue/52569; seen about once in twenty runs of FuzzServer_H2C).
// A failing input is written all the same.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
)

var fuzzFunc = regexp.MustCompile(`^func (Fuzz\w+)\(\w+ \*testing\.F\)`)

// quickCounts are the inputs a target is fuzzed for, with -quick, when it
// is far dearer than the rest. FuzzServer_H2C holds each input's
// conversation with two HTTP/2 servers over loopback, whose coverage
// varies from run to run with their goroutines, so that under the fuzzing
// engine nearly every input is "new" and is sent back and stored: 2,000
// inputs took 34 s of CPU, a fifth of everything make test fuzzes (about
// 1.7 ms an input outside the engine).
var quickCounts = map[string]string{"FuzzServer_H2C": "400x"}

// target is one fuzz target: its package ("./dir") and function.
type target struct{ pkg, fn string }

func main() {
	count := flag.String("count", "2000x", "inputs per target (go test's -fuzztime: a count, or a duration)")
	quick := flag.Bool("quick", false, "fuzz the dear targets of quickCounts for their smaller counts")
	jobs := flag.Int("jobs", 2, "builds, then targets, at a time")
	cache := flag.String("cache", "", "directory for the targets' caches of interesting inputs, and the binaries (required; emptied first)")
	list := flag.Bool("list", false, "print the targets as ./pkg:FuzzName and stop")
	goCmd := flag.String("go", "go", "the go command")
	flag.Parse()
	targets, err := find(".")
	if err != nil {
		fail(err)
	}
	if *list {
		for _, t := range targets {
			fmt.Printf("%s:%s\n", t.pkg, t.fn)
		}
		return
	}
	if *cache == "" {
		fail(fmt.Errorf("-cache is required"))
	}
	dir, err := filepath.Abs(*cache)
	if err != nil {
		fail(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		fail(err)
	}

	var pkgs []string
	for _, t := range targets {
		if len(pkgs) == 0 || pkgs[len(pkgs)-1] != t.pkg {
			pkgs = append(pkgs, t.pkg)
		}
	}
	failed := false
	report := func(ok bool, msg string, out []byte) {
		if !ok {
			failed = true
			fmt.Printf("%s: FAILED\n%s", msg, tail(out, 40))
			return
		}
		fmt.Println(msg)
	}
	var mu sync.Mutex
	bins := map[string]string{}
	each(len(pkgs), *jobs, func(i int) {
		bin := filepath.Join(dir, "bin", strings.ReplaceAll(strings.Trim(pkgs[i], "./"), "/", "_")+".test")
		out, err := exec.Command(*goCmd, "test", "-c", "-fuzz=.", "-o", bin, pkgs[i]).CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			report(false, "fuzz build "+pkgs[i], append(out, err.Error()...))
			return
		}
		bins[pkgs[i]] = bin
	})
	each(len(targets), *jobs, func(i int) {
		t := targets[i]
		bin, ok := bins[t.pkg]
		if !ok {
			return // its build failed, reported
		}
		n := *count
		if q, ok := quickCounts[t.fn]; ok && *quick {
			n = q
		}
		// One fuzzing worker per target (go test's default is one per
		// CPU): -jobs targets run at once, and each worker more is a
		// process more that starts and gathers the seeds' coverage again.
		cmd := exec.Command(bin, "-test.paniconexit0", "-test.timeout=10m", "-test.parallel=1", "-test.run=^$", "-test.fuzz=^"+t.fn+"$",
			"-test.fuzztime="+n, "-test.fuzzminimizetime=0", "-test.fuzzcachedir="+filepath.Join(dir, "cache", t.pkg, t.fn))
		cmd.Dir = t.pkg
		out, err := cmd.CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			out = append(out, err.Error()...)
		}
		report(err == nil, fmt.Sprintf("fuzz %s %s %s", t.pkg, t.fn, n), out)
	})
	os.RemoveAll(dir)
	if failed {
		os.Exit(1)
	}
}

// find lists the fuzz targets of the module under root by package, then
// name.
func find(root string) ([]target, error) {
	var out []target
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "build") && path != root {
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
				out = append(out, target{"./" + filepath.Dir(path), m[1]})
			}
		}
		return sc.Err()
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].pkg != out[j].pkg {
			return out[i].pkg < out[j].pkg
		}
		return out[i].fn < out[j].fn
	})
	return out, err
}

// each calls f(0..n-1), jobs at a time.
func each(n, jobs int, f func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(jobs, 1) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// tail is the last n lines of out, ending in a newline.
func tail(out []byte, n int) []byte {
	if len(out) == 0 {
		return nil
	}
	lines := bytes.SplitAfter(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return append(bytes.Join(lines, nil), '\n')
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fuzzrun:", err)
	os.Exit(1)
}
