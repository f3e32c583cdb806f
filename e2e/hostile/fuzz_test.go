package hostile

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/wasmhost"
)

// FuzzPlugin_Headers sends arbitrary methods, paths, header names and
// values, X-Forwarded-For and Authorization values through the built
// plugin. Every input must get a decision from the bridge (200 or 429; the
// config is fail_closed, so a check the bridge refuses shows as 503), and
// no VM may trap. One stack serves every input of a process (a fuzz worker
// runs many): starting the wasm VMs takes seconds.
func FuzzPlugin_Headers(f *testing.F) {
	seeds := [][6]string{
		{"GET", "/api/v1/items", "x-user-id", "alice", "203.0.113.1", ""},
		{"POST", "/h/%2e%2e/%2F/admin%00", "x-user-id", "\xff\xfe\xfd", "unknown", "Bearer a.b.c.d"},
		{"FOOBAR", "/h/../../etc/passwd", "x-junk", strings.Repeat("j", 4096), ",,,,", "Bearer ..."},
		{"get", "/h/dots", "x-user-id", "nul\x00user", "[2001:db8::1]:443", "Bearer " + validJWT("fuzz")},
		{"\x00", "", "", "", "198.51.100.20:99999", jwttest.Sign(`{"alg":"none"}`, `{"sub":"root"}`, "")},
		{"GET", "*", "X-USER-ID", "crlf\r\nx-user-id: admin", "999.1.1.1, 10.0.0.1", "Basic YWxhZGRpbjpvcGVuc2VzYW1l"},
		{"GET", "/h/q?x=%00&y=\xff", "authorization", "Bearer " + randomB64(64), "::ffff:198.51.100.24", "bearer " + jwttest.Sign(`{"alg":"RS256"}`, `{"sub":"x","exp":9999999999}`, rsaPublicPEM)},
		{"DELETE", "/h/x", "x-user-id", strings.Repeat("u", 300), strings.Repeat("1.2.3.4,", 2000), "Bearer " + strings.Repeat("a", 9000)},
		{"GET", "/h/x", ":path", "/admin", "\t", "Bearer " + validJWT(strings.Repeat("s", 300))},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	s := newStack(f, 1000)
	f.Fuzz(func(t *testing.T, method, path, name, value, xffValue, auth string) {
		before := s.host.Failures()
		info := wasmhost.RequestInfo{Method: method, Path: path, Host: "gateway.test", Headers: [][2]string{
			{strings.ToLower(name), value}, {"x-forwarded-for", xffValue}, {"authorization", auth},
		}}
		if got := s.stream(t, info); got != 200 && got != 429 {
			t.Fatalf("status %d, want a decision (200 or 429)", got)
		}
		if n := s.host.Failures(); n != before {
			t.Fatalf("the plugin trapped")
		}
	})
}
