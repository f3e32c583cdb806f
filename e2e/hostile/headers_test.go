package hostile

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/wasmhost"
)

func hdr(name, value string) [2]string { return [2]string{name, value} }
func xff(v string) [2]string           { return hdr("X-Forwarded-For", v) }
func user(v string) [2]string          { return hdr("X-User-Id", v) }
func bearer(tok string) [2]string      { return hdr("Authorization", "Bearer "+tok) }

// unsigned is a JWT with an empty signature ("header.payload.").
func unsigned(header, claims string) string {
	tok := jwttest.Sign(header, claims, "")
	return tok[:strings.LastIndexByte(tok, '.')+1]
}

func randomB64(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// httpCase is hostile input sent over HTTP/1.1. It is sent perClient times
// (each must pass) and once more (429): the limit applies. Then same, a
// clean request for the identity docs/config.md says the hostile one has,
// must be refused (it shares the counter), and other, a clean request for
// another identity, must pass.
type httpCase struct {
	name          string
	method, path  string // path "" means /h/<name>
	headers       [][2]string
	same, other   [][2]string
	samePath      string // "" means the case's path
	sameMethod    string
	otherIdentity string // documentation only: who other is
}

func jwtCases() []httpCase {
	now := time.Now()
	exp := fmt.Sprint(now.Add(time.Hour).Unix())
	claims := `{"sub":"mallory","exp":` + exp + `}`
	cases := []struct{ name, token string }{
		{"jwt bad signature", jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, claims, "attacker-secret-0123456789abcdef0123")},
		{"jwt alg none", unsigned(`{"alg":"none","typ":"JWT"}`, claims)},
		{"jwt alg none with signature", jwttest.Sign(`{"alg":"none","typ":"JWT"}`, claims, jwtSecret)},
		{"jwt alg confusion HS256 keyed with the RS256 public key", jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, claims, rsaPublicPEM)},
		{"jwt RS256 header with an HMAC signature", jwttest.Sign(`{"alg":"RS256","typ":"JWT"}`, claims, jwtSecret)},
		{"jwt RS256 header HMAC keyed with the public key", jwttest.Sign(`{"alg":"RS256","typ":"JWT"}`, claims, rsaPublicPEM)},
		{"jwt expired", jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, `{"sub":"mallory","exp":`+fmt.Sprint(now.Add(-time.Hour).Unix())+`}`, jwtSecret)},
		{"jwt without exp", jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, `{"sub":"mallory"}`, jwtSecret)},
		{"jwt not yet valid", jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, `{"sub":"mallory","exp":`+exp+`,"nbf":`+fmt.Sprint(now.Add(time.Hour).Unix())+`}`, jwtSecret)},
		{"jwt crit header", jwttest.Sign(`{"alg":"HS256","crit":["b64"],"b64":false}`, claims, jwtSecret)},
		{"jwt sub not a string", jwttest.Sign(`{"alg":"HS256"}`, `{"sub":{"$ne":null},"exp":`+exp+`}`, jwtSecret)},
		{"jwt random base64", randomB64(300)},
		{"jwt three dots", "a.b.c.d"},
		{"jwt dots only", "..."},
		{"jwt 10 KB", randomB64(3400) + "." + randomB64(3400) + "." + randomB64(600)},
		{"jwt line break in signature", validJWT("mallory")[:40] + "%0a" + validJWT("mallory")[40:]},
	}
	var out []httpCase
	for i, c := range cases {
		ip := fmt.Sprintf("203.0.113.%d", 100+i)
		out = append(out, httpCase{
			name: c.name, headers: [][2]string{xff(ip), bearer(c.token)},
			// A token that does not verify is anonymous: counted by IP.
			same:  [][2]string{xff(ip)},
			other: [][2]string{xff(ip), bearer(validJWT(fmt.Sprint("valid-", i)))}, otherIdentity: "a verified user from the same IP",
		})
	}
	return out
}

func httpCases() []httpCase {
	junk := make([][2]string, 0, 1001)
	for i := 0; i < 1000; i++ {
		junk = append(junk, hdr(fmt.Sprint("X-Junk-", i), fmt.Sprint("value-", i)))
	}
	junk = append(junk, user("many-headers"))
	peer := [][2]string{} // no X-Forwarded-For: the client is the connection peer
	cases := []httpCase{
		{name: "60 KiB X-Forwarded-For, valid last hop", headers: [][2]string{xff(strings.Repeat("10.0.0.1, ", 6200) + "203.0.113.1")},
			same: [][2]string{xff("203.0.113.1")}, other: [][2]string{xff("203.0.113.2")}},
		{name: "60 KiB X-Forwarded-For of garbage", headers: [][2]string{xff(strings.Repeat("x", 60<<10))},
			same: peer, other: [][2]string{xff("203.0.113.3")}},
		{name: "8 KiB+ Authorization", headers: [][2]string{xff("203.0.113.4"), hdr("Authorization", "Bearer "+strings.Repeat("a", 9000))},
			same: [][2]string{xff("203.0.113.4")}, other: [][2]string{xff("203.0.113.4"), bearer(validJWT("eight-kib"))}},
		{name: "60 KiB user id", headers: [][2]string{xff("203.0.113.5"), user(strings.Repeat("u", 60<<10))},
			same: [][2]string{xff("203.0.113.5")}, other: [][2]string{xff("203.0.113.5"), user("u5")}},
		{name: "1,000 headers", headers: junk,
			same: [][2]string{user("many-headers"), xff("198.51.100.1")}, other: [][2]string{user("many-headers-2")}},
		{name: "xff unknown", headers: [][2]string{xff("unknown")}, same: peer, other: [][2]string{xff("203.0.113.6")}},
		{name: "xff garbage", headers: [][2]string{xff("not an address; drop table")}, same: peer, other: [][2]string{xff("203.0.113.6")}},
		{name: "xff commas only", headers: [][2]string{xff(",,,,")}, same: peer, other: [][2]string{xff("203.0.113.6")}},
		{name: "xff blanks and commas", headers: [][2]string{xff(" , ,\t, ")}, same: peer, other: [][2]string{xff("203.0.113.6")}},
		{name: "xff ipv4 with port", headers: [][2]string{xff("198.51.100.20:8080")}, same: [][2]string{xff("198.51.100.20")}, other: [][2]string{xff("198.51.100.21")}},
		{name: "xff bad port", headers: [][2]string{xff("198.51.100.20:99999")}, same: peer, other: [][2]string{xff("198.51.100.20")}},
		{name: "xff bracketed ipv6 with port", headers: [][2]string{xff("[2001:db8::20]:443")}, same: [][2]string{xff("2001:db8::20")}, other: [][2]string{xff("2001:db8::21")}},
		{name: "xff bracketed ipv6", headers: [][2]string{xff("[2001:db8::22]")}, same: [][2]string{xff("2001:db8::22")}, other: [][2]string{xff("2001:db8::21")}},
		{name: "xff bracketed ipv4", headers: [][2]string{xff("[198.51.100.22]")}, same: peer, other: [][2]string{xff("198.51.100.22")}},
		{name: "xff unclosed bracket", headers: [][2]string{xff("[2001:db8::23")}, same: peer, other: [][2]string{xff("2001:db8::23")}},
		{name: "xff ipv4-mapped ipv6", headers: [][2]string{xff("::ffff:198.51.100.24")}, same: [][2]string{xff("198.51.100.24")}, other: [][2]string{xff("198.51.100.25")}},
		{name: "xff out of range octet", headers: [][2]string{xff("999.1.1.1")}, same: peer, other: [][2]string{xff("203.0.113.6")}},
		{name: "xff spoofed left, garbage last hop", headers: [][2]string{xff("198.51.100.26, unknown")}, same: peer, other: [][2]string{xff("198.51.100.26")}},
		{name: "xff garbage left, valid last hop", headers: [][2]string{xff("unknown, 198.51.100.27")}, same: [][2]string{xff("198.51.100.27")}, other: [][2]string{xff("198.51.100.28")}},
		{name: "invalid utf-8 user id", headers: [][2]string{user("\xff\xfe\xfd"), xff("198.51.100.30")},
			same: [][2]string{user("\xff\xfe\xfd"), xff("198.51.100.31")}, other: [][2]string{user("\xff\xfe\xfc")}},
		{name: "tab inside user id", headers: [][2]string{user("a\tb")}, same: [][2]string{user("a\tb"), xff("198.51.100.32")}, other: [][2]string{user("a b")}},
		{name: "invalid utf-8 in path", path: "/h/utf8/\xff\xfe/\xc0\xae", headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "percent-encoded dot segments", path: "/h/pct/%2e%2e/%2F/admin%00", headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "dot segments", path: "/h/dots/../../etc/passwd", headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "overlong utf-8 escapes", path: "/h/overlong/%C0%AE%C0%AE/%ff%fe", headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "query with escapes", path: "/h/query?x=%00&y=%ff&z=" + strings.Repeat("q", 4000), headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "500-byte path", path: "/h/long/" + strings.Repeat("p", 490), headers: [][2]string{user("path-user")},
			same: [][2]string{user("path-user"), xff("198.51.100.33")}, other: [][2]string{user("path-user-2")}},
		{name: "method FOOBAR", method: "FOOBAR", headers: [][2]string{user("method-user")},
			sameMethod: "GET", same: [][2]string{user("method-user")}, other: [][2]string{user("method-user-2")}},
		{name: "method 200 bytes", method: strings.Repeat("M", 200), headers: [][2]string{user("method-user")},
			sameMethod: "GET", same: [][2]string{user("method-user")}, other: [][2]string{user("method-user-2")}},
		{name: "method lower-case", method: "get", headers: [][2]string{user("method-user")},
			sameMethod: "DELETE", same: [][2]string{user("method-user")}, other: [][2]string{user("method-user-2")}},
	}
	return append(cases, jwtCases()...)
}

func TestHostile_HTTPHeaders(t *testing.T) {
	s := newStack(t, 1000)
	for i, c := range httpCases() {
		t.Run(c.name, func(t *testing.T) {
			method, path := c.method, c.path
			if method == "" {
				method = "GET"
			}
			if path == "" {
				path = fmt.Sprintf("/h/%d", i)
			}
			hostile := rawRequest(method, path, c.headers...)
			for n := 1; n <= perClient+1; n++ {
				want := 200
				if n > perClient {
					want = 429
				}
				if got := s.send(t, hostile); got != want {
					t.Fatalf("hostile request %d: status %d, want %d", n, got, want)
				}
			}
			sameMethod := c.sameMethod
			if sameMethod == "" {
				sameMethod = method
			}
			if got := s.send(t, rawRequest(sameMethod, path, c.same...)); got != 429 {
				t.Errorf("clean request for the same identity: %d, want 429 (the hostile requests were counted elsewhere)", got)
			}
			if got := s.send(t, rawRequest(method, path, c.other...)); got != 200 {
				t.Errorf("clean request for another identity: %d, want 200", got)
			}
		})
	}
	s.checkAccounts(t)
}

// TestHostile_StreamBytes sends, straight to the plugin, bytes that no
// HTTP/1.1 server passes on (NUL, CR, LF, non-token header names, empty
// or odd pseudo headers): a proxy with a lenient codec, or a bug in one,
// must not make the plugin trap. Each request goes perClient+1 times: the
// limit still applies to its identity.
func TestHostile_StreamBytes(t *testing.T) {
	s := newStack(t, 1000)
	type streamCase struct {
		name string
		info wasmhost.RequestInfo
	}
	u := func(i int) [2]string { return [2]string{"x-user-id", fmt.Sprint("stream-user-", i)} }
	cases := []streamCase{
		{"NUL in user id", wasmhost.RequestInfo{Headers: [][2]string{{"x-user-id", "nul\x00user"}}}},
		{"CR LF in user id", wasmhost.RequestInfo{Headers: [][2]string{{"x-user-id", "crlf\r\nx-user-id: admin"}}}},
		{"DEL and C0 controls in user id", wasmhost.RequestInfo{Headers: [][2]string{{"x-user-id", "\x7f\x01\x02\x1b[31m"}}}},
		{"NUL in X-Forwarded-For", wasmhost.RequestInfo{Headers: [][2]string{u(3), {"x-forwarded-for", "198.51.100.40\x00, 10.0.0.1"}}}},
		{"NUL in Authorization", wasmhost.RequestInfo{Headers: [][2]string{u(4), {"authorization", "Bearer \x00" + validJWT("nul")}}}},
		{"non-token header names", wasmhost.RequestInfo{Headers: [][2]string{u(5), {"x user id", "spaces"}, {"", "empty name"}, {"x-user-id:", "colon"}, {"X-USER-ID", "upper"}, {"\xff\xfe", "binary"}}}},
		{"empty method and path", wasmhost.RequestInfo{Method: "", Path: "", Headers: [][2]string{u(6)}}},
		{"path without slash", wasmhost.RequestInfo{Path: "h/no-slash", Headers: [][2]string{u(7)}}},
		{"asterisk path", wasmhost.RequestInfo{Method: "OPTIONS", Path: "*", Headers: [][2]string{u(8)}}},
		{"NUL and CR in path", wasmhost.RequestInfo{Path: "/h/\x00/\r\n", Headers: [][2]string{u(9)}}},
		{"200-byte binary path", wasmhost.RequestInfo{Path: "/h/" + strings.Repeat("\xff", 200), Headers: [][2]string{u(10)}}},
		{"1 MiB header value", wasmhost.RequestInfo{Headers: [][2]string{u(11), {"x-big", strings.Repeat("b", 1<<20)}}}},
		{"1 MiB X-Forwarded-For", wasmhost.RequestInfo{Headers: [][2]string{u(12), {"x-forwarded-for", strings.Repeat("1.2.3.4,", 1<<17)}}}},
		{"binary method and authority", wasmhost.RequestInfo{Method: "\x00\xff", Host: "\x00evil\xff:99999", Headers: [][2]string{u(13)}}},
		{"duplicate identity headers", wasmhost.RequestInfo{Headers: [][2]string{u(14), {"x-user-id", "admin"}, {"x-forwarded-for", "1.1.1.1"}, {"x-forwarded-for", "2.2.2.2"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			info := c.info
			if info.Method == "" && c.name != "empty method and path" {
				info.Method = "GET"
			}
			if info.Path == "" && c.name != "empty method and path" {
				info.Path = "/h/stream"
			}
			for n := 1; n <= perClient+1; n++ {
				want := 200
				if n > perClient {
					want = 429
				}
				if got := s.stream(t, info); got != want {
					t.Fatalf("request %d: status %d, want %d", n, got, want)
				}
			}
		})
	}
	s.checkAccounts(t)
}
