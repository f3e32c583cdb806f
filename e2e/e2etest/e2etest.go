// Package e2etest holds what tests that run the built plugin share.
package e2etest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/wasmbuild"
)

var (
	once sync.Once
	wasm []byte
	err  error
)

// Plugin returns BuildPlugin's module, failing t when it cannot be built.
func Plugin(t testing.TB) []byte {
	t.Helper()
	b, err := BuildPlugin()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BuildPlugin returns the plugin built exactly as `make wasm` builds it,
// once per test process, so a stale build/plugin.wasm can never pass for
// the current code. It builds into a directory of its own: test packages
// run in parallel and must not write one file.
func BuildPlugin() ([]byte, error) {
	once.Do(func() {
		// By import path: go resolves it from the test's directory, in
		// the module, whatever -trimpath (make test) does to source paths.
		const pkg = "github.com/sluicehq/sluice/plugin"
		var dir string
		if dir, err = os.MkdirTemp("", "sluice-plugin-"); err != nil {
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "plugin.wasm")
		if err = wasmbuild.Build(pkg, out); err == nil {
			wasm, err = os.ReadFile(out)
		}
	})
	return wasm, err
}
