package asciifold

import "testing"

func TestEqualLower(t *testing.T) {
	for _, tc := range []struct {
		b, lower string
		want     bool
	}{
		{"content-length", "content-length", true},
		{"Content-Length", "content-length", true},
		{"CONTENT-LENGTH", "content-length", true},
		{"content-lengt", "content-length", false},
		{"content-lengths", "content-length", false},
		{"content_length", "content-length", false},
		{"\u212aey", "key", false}, // the Kelvin sign folds to k in Unicode, not in HTTP
		{"[", "{", false},          // 0x5b is not a letter: it does not fold to 0x7b
		{"", "", true},
	} {
		if got := EqualLower([]byte(tc.b), tc.lower); got != tc.want {
			t.Errorf("EqualLower(%q, %q) = %v, want %v", tc.b, tc.lower, got, tc.want)
		}
	}
}

func TestLower(t *testing.T) {
	for _, tc := range []struct{ s, want string }{
		{"x-request-id", "x-request-id"},
		{"X-Request-Id", "x-request-id"},
		{"\u212aEY", "\u212aey"}, // only ASCII letters change
		{"", ""},
	} {
		if got := Lower(tc.s); got != tc.want {
			t.Errorf("Lower(%q) = %q, want %q", tc.s, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = Lower("x-request-id") }); n != 0 {
		t.Errorf("Lower of a lower-case name allocates %v times", n)
	}
}
