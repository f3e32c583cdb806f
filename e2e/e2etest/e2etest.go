// Package e2etest holds what tests that run the built plugin share.
package e2etest

import (
	"errors"
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
		var root string
		if root, err = moduleRoot(); err != nil {
			return
		}
		pkg := filepath.Join(root, "plugin")
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

// moduleRoot is the directory of the go.mod above the working directory,
// where a test runs: its package's. Not the source file's own path, which
// -trimpath (make test) leaves without a directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("e2etest: no go.mod above the working directory")
		}
		dir = parent
	}
}
