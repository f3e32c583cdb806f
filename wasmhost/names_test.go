package wasmhost

import (
	"net/textproto"
	"strings"
	"testing"
)

// The tables give what converting the name would: net/http's canonical
// form and the lower case, for every name in them and for others.
func TestNames(t *testing.T) {
	names := []string{"x-unknown-header", "X-MiXeD", "a", "", strings.Repeat("Long-", 10)}
	for c := range lowerNames {
		names = append(names, c)
	}
	for _, n := range names {
		l := strings.ToLower(n)
		if got := lowerName(n); got != l {
			t.Errorf("lowerName(%q) = %q, want %q", n, got, l)
		}
		if got := lowerString([]byte(n)); got != l {
			t.Errorf("lowerString(%q) = %q, want %q", n, got, l)
		}
		if got, want := canonicalName(l), textproto.CanonicalMIMEHeaderKey(l); got != want {
			t.Errorf("canonicalName(%q) = %q, want %q", l, got, want)
		}
	}
	if n := testing.AllocsPerRun(10, func() {
		_ = lowerString([]byte("X-RateLimit-Remaining"))
		_ = canonicalName("x-ratelimit-remaining")
		_ = lowerName("Content-Type")
	}); n != 0 {
		t.Errorf("known names: %v allocations", n)
	}
}
