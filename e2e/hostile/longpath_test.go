package hostile

import (
	"strings"
	"testing"
)

// TestHostile_LongPathIsLimited: a request path longer than what the
// bridge accepts as a check's "endpoint" (rules.MaxKeyLen) once made the
// bridge refuse the check, and with fail_open every such request passed
// uncounted: padding the path escaped every limit. The plugin now leaves
// over-long override fields out of the check.
func TestHostile_LongPathIsLimited(t *testing.T) {
	s := newStackWith(t, config(1000, "fail_open", perClient))
	path := "/h/long/" + strings.Repeat("p", 600)
	req := rawRequest("GET", path, user("long-path-user"))
	for n := 1; n <= perClient+1; n++ {
		want := 200
		if n > perClient {
			want = 429
		}
		if got := s.send(t, req); got != want {
			t.Fatalf("request %d with a %d-byte path: status %d, want %d", n, len(path), got, want)
		}
	}
}
