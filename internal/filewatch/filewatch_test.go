package filewatch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSeen_Note(t *testing.T) {
	var s Seen
	a := map[string][]byte{"a": []byte("1")}
	for _, tt := range []struct {
		name  string
		files map[string][]byte
		err   error
		want  bool
	}{
		{"the first read", a, nil, true},
		{"the same again", map[string][]byte{"a": []byte("1")}, nil, false},
		{"a file changed", map[string][]byte{"a": []byte("2")}, nil, true},
		{"a file added", map[string][]byte{"a": []byte("2"), "b": nil}, nil, true},
		{"a file removed", map[string][]byte{"a": []byte("2")}, nil, true},
		{"an error", nil, errors.New("gone"), true},
		{"the same error", nil, errors.New("gone"), false},
		{"another error", nil, errors.New("empty"), true},
		{"read again", a, nil, true},
	} {
		if got := s.Note(tt.files, tt.err); got != tt.want {
			t.Errorf("%s: %t, want %t", tt.name, got, tt.want)
		}
	}
	var empty Seen
	if !empty.Note(nil, nil) {
		t.Error("the first note of nothing: no change")
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(a, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := Read(a)
	if err != nil || string(files[a]) != "x" || len(files) != 1 {
		t.Fatalf("Read: %q, %v", files, err)
	}
	if _, err := Read(a, filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}
