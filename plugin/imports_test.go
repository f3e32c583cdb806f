//go:build !wasip1

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/envoyhosts"
	"github.com/sluicehq/sluice/internal/wasmfile"
)

// TestPlugin_LoadsInEveryEnvoy: every function the built module imports is
// provided by every Envoy release of the table (internal/envoyhosts); a
// module with one more import is refused at load by the releases that lack
// it, and under Istio the plugin is then rejected.
func TestPlugin_LoadsInEveryEnvoy(t *testing.T) {
	imps, err := wasmfile.Imports(wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, imp := range imps {
		if imp.Kind != 0 {
			t.Errorf("the module imports %s, which is not a function: no Envoy provides it", imp)
			continue
		}
		names = append(names, imp.String())
	}
	for _, why := range envoyhosts.Lacking(names) {
		t.Error(why)
	}
}

// Functions the plugin must not link: package net (whose init opens files),
// os file functions and the syscalls under them, and timers. Linking one
// changes the module's import list (net's init pulled in
// wasi_snapshot_preview1.path_filestat_get), or needs what a proxy VM does
// not have: its WASI has no files, and a VM runs only in callbacks, so a
// timer never fires.
var forbiddenPrefixes = []string{"net.", "os.(*File).", "crypto/x509."}

var forbiddenFuncs = []string{
	"os.Open", "os.OpenFile", "os.Create", "os.Chmod", "os.Stat", "os.Lstat", "os.ReadFile", "os.WriteFile",
	"syscall.Open", "syscall.Stat", "syscall.Lstat", "syscall.Fstat",
	"time.AfterFunc", "time.NewTimer", "time.NewTicker", "time.Sleep",
}

// TestPlugin_LinksNoFilesNetOrTimers reads the function names Go's linker
// writes into the module.
func TestPlugin_LinksNoFilesNetOrTimers(t *testing.T) {
	names, err := wasmfile.FunctionNames(wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal("the module has no function names to check")
	}
	for _, n := range names {
		if slices.Contains(forbiddenFuncs, n) || slices.ContainsFunc(forbiddenPrefixes, func(p string) bool { return strings.HasPrefix(n, p) }) {
			t.Errorf("the plugin links %s", n)
		}
	}
}

// TestDocs_NameTheReleasesThatLoadThePlugin: the files an operator reads
// first say which Envoy and Istio releases load the module, as the table
// the imports are checked against does.
func TestDocs_NameTheReleasesThatLoadThePlugin(t *testing.T) {
	oldest := envoyhosts.Hosts()[0]
	envoy, istio := "Envoy "+oldest.Envoy+" or later", "Istio "+oldest.Istio+" or later"
	files := map[string][]string{
		"README.md":                         {envoy, istio},
		"docs/deploy.md":                    {envoy, istio},
		"envoy.yaml":                        {envoy},
		"deploy/istio/wasmplugin.yaml":      {istio},
		"deploy/istio/mesh/wasmplugin.yaml": {istio},
	}
	for file, phrases := range files {
		b, err := os.ReadFile(filepath.Join("..", file))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ") // phrases may wrap
		text = strings.ReplaceAll(text, "# ", "")            // and span YAML comments
		for _, p := range phrases {
			if !strings.Contains(text, p) {
				t.Errorf("%s does not say %q", file, p)
			}
		}
	}
	b, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range envoyhosts.Hosts() {
		for _, c := range h.CPPHost {
			if !strings.Contains(string(b), c) {
				t.Errorf("docs/deploy.md's table of releases does not name host library commit %s (%s)", c, h.Releases())
			}
		}
	}
}

// TestPlugin_DataPacked: the built module's data is in a few segments
// (internal/wasmbuild merges the tens of thousands Go's linker writes),
// which every engine keeps and walks for each VM it starts.
func TestPlugin_DataPacked(t *testing.T) {
	n, err := wasmfile.DataSegmentCount(wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n > 16 {
		t.Errorf("%d data segments", n)
	}
}

// TestPlugin_ExportsOnlyWhatItActsOn: the built module exports the
// callbacks the filter does something in, and no other. A host enters the
// module for every callback the module exports, whether or not the
// plugin acts on it: proxy_on_request_body on every chunk of a request
// body, proxy_on_response_trailers on every gRPC response, proxy_on_log
// and proxy_on_done on every request (docs/deploy.md, "What the plugin and
// the gateway cost").
func TestPlugin_ExportsOnlyWhatItActsOn(t *testing.T) {
	got, err := wasmfile.FunctionExports(wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"_initialize", // Go's c-shared start; hosts run it before any callback
		"proxy_abi_version_0_2_1", "proxy_on_memory_allocate",
		"proxy_on_vm_start", "proxy_on_configure", "proxy_on_tick",
		"proxy_on_context_create", "proxy_on_delete",
		"proxy_on_request_headers", "proxy_on_response_headers",
		"proxy_on_response_body", // a response whose cost is in its body (filter.Stream.OnResponseBody)
		"proxy_on_http_call_response",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the module exports\n%q\nwant\n%q", got, want)
	}
}
