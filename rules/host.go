package rules

import (
	"errors"
	"net/netip"
	"strings"
)

// Host patterns are lower-case and either exact ("api.example.com",
// "10.0.0.1", "[2001:db8::1]") or a wildcard over subdomains
// ("*.example.com" matches "a.example.com" and "a.b.example.com", not
// "example.com").

var (
	errHostEmpty    = errors.New("host pattern is empty")
	errHostTooLong  = errors.New("host pattern is longer than 253 bytes")
	errHostCase     = errors.New("host pattern must be lower-case")
	errHostPort     = errors.New("host pattern must not carry a port")
	errHostWildcard = errors.New(`host pattern may use "*" only as a whole first label ("*.example.com")`)
	errHostLabel    = errors.New("host pattern has an empty label or one longer than 63 bytes")
	errHostByte     = errors.New("host pattern may hold only a-z, 0-9, '-', '_' and '.'")
	errHostIPv6     = errors.New("host pattern holds an invalid or non-canonical IPv6 address (write it as [2001:db8::1])")
)

// ValidHostPattern reports why s cannot be used as a host pattern.
func ValidHostPattern(s string) error {
	if s == "" {
		return errHostEmpty
	}
	if len(s) > 253 {
		return errHostTooLong
	}
	if s[0] == '[' {
		if s[len(s)-1] != ']' {
			return errHostPort
		}
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !a.Is6() || a.Zone() != "" || a.String() != s[1:len(s)-1] {
			return errHostIPv6
		}
		return nil
	}
	name := s
	if strings.HasPrefix(s, "*.") {
		name = s[2:]
	}
	label := 0
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'A' && c <= 'Z':
			return errHostCase
		case c == ':':
			return errHostPort
		case c == '*':
			return errHostWildcard
		case c == '.':
			if label == 0 {
				return errHostLabel
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return errHostByte
		}
		label++
		if label > 63 {
			return errHostLabel
		}
	}
	if label == 0 {
		return errHostLabel
	}
	return nil
}

// MatchHost reports whether host, as found in :authority or Host (any
// case, maybe with a port, maybe with a trailing dot), matches a valid
// pattern. It does not allocate.
func MatchHost(pattern, host string) bool {
	host = hostOnly(host)
	if strings.HasPrefix(pattern, "*.") {
		suffix := pattern[1:] // ".example.com"
		return len(host) > len(suffix) && equalFoldLower(host[len(host)-len(suffix):], suffix)
	}
	return len(host) == len(pattern) && equalFoldLower(host, pattern)
}

// hostOnly strips a port and one trailing dot.
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[:i+1]
		}
		return h
	}
	if i := strings.IndexByte(h, ':'); i >= 0 {
		if strings.IndexByte(h[i+1:], ':') >= 0 {
			return h // a bare IPv6 address, no port
		}
		h = h[:i]
	}
	if len(h) > 1 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	return h
}

// equalFoldLower compares s, of any case, with lower, which is lower-case.
// ASCII only: host names are ASCII (IDNs travel as punycode).
func equalFoldLower(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
