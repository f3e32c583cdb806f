package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestFind(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"b/b_test.go":                    "package b\n\nfunc FuzzZ(f *testing.F) {}\nfunc FuzzA(f *testing.F) {}\nfunc TestFuzzNot(t *testing.T) {}\n",
		"a/x/x_test.go":                  "package x\n\nfunc FuzzX(ff *testing.F) {\n}\n",
		"a/x/x.go":                       "package x\n\nfunc FuzzNotATest(f *testing.F) {}\n",
		"a/testdata/t_test.go":           "package t\n\nfunc FuzzInTestdata(f *testing.F) {}\n",
		"build/g_test.go":                "package g\n\nfunc FuzzInBuild(f *testing.F) {}\n",
		".git/h_test.go":                 "package h\n\nfunc FuzzHidden(f *testing.F) {}\n",
		"c/c_test.go":                    "package c\n\n// func FuzzComment(f *testing.F) {}\nfunc helper(f *testing.F) {}\n",
		"a/x/testdata/fuzz/FuzzX/abcdef": "go test fuzz v1\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root)
	got, err := find(".")
	if err != nil {
		t.Fatal(err)
	}
	want := []target{{"./a/x", "FuzzX"}, {"./b", "FuzzA"}, {"./b", "FuzzZ"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 2, ""},
		{"a", 2, "a\n"},
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc", 2, "b\nc\n"},
		{"a\nb\n", 5, "a\nb\n"},
	} {
		if got := string(tail([]byte(tc.in), tc.n)); got != tc.want {
			t.Errorf("tail(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
