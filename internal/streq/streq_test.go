package streq

import (
	"strings"
	"testing"
)

func TestEqual(t *testing.T) {
	// Every length up to past the inline cases, equal and differing at
	// each byte, with the strings at different offsets of their buffers.
	buf := strings.Repeat("abcdefghijklmnopqrstuvwxyz", 2)
	for n := 0; n <= 20; n++ {
		for off := 0; off < 4; off++ {
			a := buf[off : off+n]
			b := string([]byte(a)) // another buffer
			if !Equal(a, b) {
				t.Fatalf("%q != its copy", a)
			}
			for i := 0; i < n; i++ {
				c := []byte(b)
				c[i] ^= 0x20
				if Equal(a, string(c)) {
					t.Fatalf("%q == %q", a, c)
				}
			}
			if Equal(a, a+"x") || Equal(a+"x", a) {
				t.Fatalf("%q equals a longer string", a)
			}
		}
	}
}

func FuzzEqual(f *testing.F) {
	f.Add("x-user-id", "x-user-ie")
	f.Add("GET", "GET")
	f.Fuzz(func(t *testing.T, a, b string) {
		if got, want := Equal(a, b), a == b; got != want {
			t.Fatalf("Equal(%q, %q) = %v, want %v", a, b, got, want)
		}
		if !Equal(a, strings.Clone(a)) {
			t.Fatalf("%q != its copy", a)
		}
	})
}
