package e2etest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
)

var (
	cacheOnce sync.Once
	cache     wazero.CompilationCache
	cacheErr  error
)

// cacheMaxAge is how long a compiled module stays on disk: long enough for
// one run of the suite, short enough that the modules of earlier builds of
// the plugin (about 24 MB each) do not pile up.
const cacheMaxAge = time.Hour

// CompilationCache returns OpenCompilationCache's cache, failing t when it
// cannot be opened.
func CompilationCache(t testing.TB) wazero.CompilationCache {
	t.Helper()
	c, err := OpenCompilationCache()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// OpenCompilationCache returns a wazero compilation cache on disk, in the
// checkout's build/wazero-cache, for the hosts a test starts. Each test
// package runs in a process of its own, and so does each fuzz worker;
// compiling the plugin costs about 2 s of CPU, and with only the cache of
// its process make test compiled the same plugin 14 times. Entries are
// keyed by the module's bytes and wazero's version, so a changed plugin
// never meets a stale one; those older than an hour are removed when a
// process first opens the cache.
func OpenCompilationCache() (wazero.CompilationCache, error) {
	cacheOnce.Do(func() {
		var dir string
		if dir, cacheErr = cacheDir(); cacheErr != nil {
			return
		}
		prune(dir, time.Now().Add(-cacheMaxAge))
		cache, cacheErr = wazero.NewCompilationCacheWithDir(dir)
	})
	return cache, cacheErr
}

// cacheDir is build/wazero-cache in the module's root, found from the
// test's directory (go test runs a test in its package's directory).
func cacheDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "build", "wazero-cache"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("e2etest: no go.mod above the test's directory")
		}
		dir = parent
	}
}

// prune removes the files under dir last written before cutoff. Another
// test process reading one at that moment keeps its open file, or finds
// none and compiles the module again.
func prune(dir string, cutoff time.Time) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().Before(cutoff) {
			_ = os.Remove(path)
		}
		return nil
	})
}
