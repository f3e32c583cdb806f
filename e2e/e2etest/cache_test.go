package e2etest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	files := map[string]time.Time{
		"wazero-v1/old":   now.Add(-2 * time.Hour),
		"wazero-v1/new":   now.Add(-time.Minute),
		"wazero-v0/older": now.Add(-48 * time.Hour),
		"top":             now,
	}
	for name, mtime := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	prune(dir, now.Add(-cacheMaxAge))
	for name, mtime := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if kept := err == nil; kept != mtime.After(now.Add(-cacheMaxAge)) {
			t.Errorf("%s, written %v ago: kept %v", name, now.Sub(mtime).Round(time.Minute), kept)
		}
	}
}

func TestCacheDir(t *testing.T) {
	got, err := cacheDir()
	if err != nil {
		t.Fatal(err)
	}
	// This package's directory is e2e/e2etest in the module.
	wd, _ := os.Getwd()
	if want := filepath.Join(filepath.Dir(filepath.Dir(wd)), "build", "wazero-cache"); got != want {
		t.Fatalf("cacheDir() = %s, want %s", got, want)
	}
}
