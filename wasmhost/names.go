package wasmhost

import (
	"net/textproto"
	"strings"
)

// Header names pass between net/http, which keeps them canonical
// ("User-Agent"), and the plugin, which sees them as Envoy keeps them
// ("user-agent"), several times a request. The names most requests,
// answers and rate-limit checks carry are converted through these tables,
// without allocating; others are converted as they come.
var lowerNames, canonicalNames = func() (lower, canonical map[string]string) {
	lower, canonical = map[string]string{}, map[string]string{}
	for _, n := range []string{
		"Accept", "Accept-Charset", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Date", "Etag",
		"Forwarded", "If-Match", "If-Modified-Since", "If-None-Match", "Last-Modified", "Location",
		"Origin", "Pragma", "Referer", "Retry-After", "Server", "Set-Cookie", "Traceparent", "Tracestate",
		"Transfer-Encoding", "User-Agent", "Vary", "Via", "X-Api-Key", "X-B3-Traceid", "X-B3-Spanid",
		"X-Content-Type-Options", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
		"X-Real-Ip", "X-Request-Id", "X-Tenant-Id", "X-User-Id",
		// What Sluice's plugin adds to answers with its default prefix.
		"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Strategy",
		"X-Ratelimit-Delay", "Ratelimit", "Ratelimit-Policy",
	} {
		l := strings.ToLower(n)
		lower[n], canonical[l] = l, n
	}
	return lower, canonical
}()

// lowerName lower-cases a header name.
func lowerName(k string) string {
	if l, ok := lowerNames[k]; ok {
		return l
	}
	return strings.ToLower(k)
}

// canonicalName is the canonical form of a lower-case header name, as
// net/http's Header.Add would key it.
func canonicalName(l string) string {
	if c, ok := canonicalNames[l]; ok {
		return c
	}
	return textproto.CanonicalMIMEHeaderKey(l)
}

// lowerString is b (a header name in guest memory) lower-cased as a
// string: a known name without allocating.
func lowerString(b []byte) string {
	var buf [32]byte
	if len(b) > len(buf) {
		return strings.ToLower(string(b))
	}
	l := buf[:len(b)]
	copy(l, b)
	lowerASCII(l)
	if c, ok := canonicalNames[string(l)]; ok {
		return lowerNames[c]
	}
	return string(l)
}

// lowerASCII lower-cases the ASCII letters of b in place: a header name
// as Envoy keeps it.
func lowerASCII(b []byte) {
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
}
