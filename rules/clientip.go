package rules

import (
	"errors"
	"net/netip"
	"strings"
)

// Client addresses come from headers that clients can write. Only the
// entries appended by proxies we trust are believed: either a configured
// number of hops counted from the right of X-Forwarded-For, or every entry
// inside configured proxy prefixes. The leftmost entry, which many
// limiters use, is whatever the client chose to send.
//
// Parsing here runs per request over attacker-sized headers, so it walks
// by index, never splits, and uses its own address parser: net/netip
// allocates an error value for every invalid entry.

// maxAddrEntry bounds one X-Forwarded-For entry worth parsing; the longest
// valid form, "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255%zone]:65535",
// is well under it.
const maxAddrEntry = 128

var (
	errPrefixEmpty = errors.New("address is empty")
	errPrefixZone  = errors.New("address must not carry an IPv6 zone")
	errPrefixBad   = errors.New(`not an IP address or CIDR prefix ("10.0.0.0/8", "2001:db8::/32", "1.2.3.4")`)
	errPrefixBits  = errors.New("prefix length out of range")
)

// ParseIPPrefix parses a CIDR prefix or a single address (as /32 or /128)
// from config. The result is masked; IPv4-mapped IPv6 becomes IPv4.
func ParseIPPrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, errPrefixEmpty
	}
	if strings.IndexByte(s, '%') >= 0 {
		return netip.Prefix{}, errPrefixZone
	}
	if strings.IndexByte(s, '/') < 0 {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, errPrefixBad
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if _, aerr := netip.ParseAddr(s[:strings.IndexByte(s, '/')]); aerr == nil {
			return netip.Prefix{}, errPrefixBits
		}
		return netip.Prefix{}, errPrefixBad
	}
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, nil
}

// ParseSourceAddress parses Envoy's source.address property: "1.2.3.4:5678",
// "[2001:db8::1]:443" or a bare address. IPv4-mapped IPv6 becomes IPv4;
// zones are dropped.
func ParseSourceAddress(s string) (netip.Addr, bool) {
	return parseHostAddr(s)
}

// ClientIP picks the client address of a request from the X-Forwarded-For
// and X-Real-IP header values and the connection peer (source, as
// ParseSourceAddress). It returns the zero Addr when nothing usable is
// known. It runs in time linear in the header sizes and does not allocate.
func ClientIP(cfg *ClientIPConfig, xff, xRealIP, source string) netip.Addr {
	peer, _ := parseHostAddr(source)
	if len(cfg.TrustedProxies) > 0 {
		// Headers from a peer we do not trust were written by the client.
		// An unknown peer is not trusted either.
		if !peer.IsValid() || !inPrefixes(cfg.TrustedProxies, peer) {
			return peer
		}
		if a, ok := walkTrusted(cfg.TrustedProxies, xff); ok {
			return a
		}
	} else if cfg.TrustedProxyDepth > 0 {
		if a, ok := nthFromRight(xff, cfg.TrustedProxyDepth); ok {
			return a
		}
	}
	if cfg.UseXRealIP {
		if a, ok := parseHostAddr(xRealIP); ok {
			return a
		}
	}
	return peer
}

// walkTrusted returns the rightmost X-Forwarded-For address outside the
// trusted prefixes, or the leftmost one when all are trusted. An invalid
// entry ends the walk without a result: what lies left of it cannot be
// attributed to a trusted hop.
func walkTrusted(trusted []netip.Prefix, xff string) (netip.Addr, bool) {
	var last netip.Addr
	for end := len(xff); end >= 0; {
		entry, next := prevEntry(xff, end)
		end = next
		if entry == "" {
			continue // empty entries: sloppy joins, never a hop
		}
		a, ok := parseHostAddr(entry)
		if !ok {
			return netip.Addr{}, false
		}
		if !inPrefixes(trusted, a) {
			return a, true
		}
		last = a
	}
	return last, last.IsValid()
}

// nthFromRight returns the n-th non-empty X-Forwarded-For entry counted
// from the right (1-based), or the leftmost when there are fewer.
func nthFromRight(xff string, n int) (netip.Addr, bool) {
	var leftmost string
	for end := len(xff); end >= 0; {
		entry, next := prevEntry(xff, end)
		end = next
		if entry == "" {
			continue
		}
		leftmost = entry
		if n--; n == 0 {
			break
		}
	}
	if leftmost == "" {
		return netip.Addr{}, false
	}
	return parseHostAddr(leftmost)
}

// prevEntry returns the comma-separated entry of s that ends at end, with
// spaces and tabs trimmed, and the end of the entry before it (-1 when
// there is none).
func prevEntry(s string, end int) (string, int) {
	start := end
	for start > 0 && s[start-1] != ',' {
		start--
	}
	entry := s[start:end]
	for len(entry) > 0 && (entry[0] == ' ' || entry[0] == '\t') {
		entry = entry[1:]
	}
	for len(entry) > 0 && (entry[len(entry)-1] == ' ' || entry[len(entry)-1] == '\t') {
		entry = entry[:len(entry)-1]
	}
	return entry, start - 1
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHostAddr parses "1.2.3.4", "1.2.3.4:80", "2001:db8::1",
// "[2001:db8::1]" or "[2001:db8::1]:443"; zones are dropped and
// IPv4-mapped addresses unmapped.
func parseHostAddr(s string) (netip.Addr, bool) {
	if len(s) == 0 || len(s) > maxAddrEntry {
		return netip.Addr{}, false
	}
	host := s
	if s[0] == '[' {
		i := strings.IndexByte(s, ']')
		if i < 0 {
			return netip.Addr{}, false
		}
		host = s[1:i]
		if rest := s[i+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		if strings.IndexByte(host, ':') < 0 {
			return netip.Addr{}, false // brackets are for IPv6 only
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.IndexByte(s[i+1:], ':') < 0 {
		// One colon: IPv4 with a port.
		if !validPort(s[i+1:]) {
			return netip.Addr{}, false
		}
		host = s[:i]
	}
	a, ok := parseAddr(host)
	if !ok {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func validPort(s string) bool {
	if len(s) == 0 || len(s) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n <= 65535
}

// parseAddr parses an IPv4 address in dotted decimal or an IPv6 address
// (RFC 4291 text form, optionally ending in dotted IPv4, optionally with a
// zone, which is dropped). It accepts what netip.ParseAddr accepts, but
// never allocates.
func parseAddr(s string) (netip.Addr, bool) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			var b [4]byte
			if !parseIPv4(s, b[:]) {
				return netip.Addr{}, false
			}
			return netip.AddrFrom4(b), true
		case ':':
			return parseIPv6(s)
		}
	}
	return netip.Addr{}, false
}

// parseIPv4 parses four decimal fields 0-255 without leading zeros into dst.
func parseIPv4(s string, dst []byte) bool {
	field, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			if digits == 1 && val == 0 {
				return false // leading zero: ambiguous (octal in some parsers)
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return false
			}
		case c == '.':
			if digits == 0 || field == 3 {
				return false
			}
			dst[field] = byte(val)
			field++
			val, digits = 0, 0
		default:
			return false
		}
	}
	if digits == 0 || field != 3 {
		return false
	}
	dst[3] = byte(val)
	return true
}

func parseIPv6(s string) (netip.Addr, bool) {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		if i == len(s)-1 {
			return netip.Addr{}, false // empty zone
		}
		s = s[:i]
	}
	var ip [16]byte
	n := 0         // bytes written
	ellipsis := -1 // byte offset of "::"
	if strings.HasPrefix(s, "::") {
		ellipsis = 0
		s = s[2:]
	}
	for len(s) > 0 {
		if n == 16 {
			return netip.Addr{}, false
		}
		// One group of 1 to 4 hex digits.
		val, off := 0, 0
		for ; off < len(s) && off < 5; off++ {
			d := unhex(s[off])
			if d < 0 {
				break
			}
			val = val<<4 | d
		}
		if off == 0 || off > 4 {
			return netip.Addr{}, false
		}
		if off < len(s) && s[off] == '.' {
			// Trailing dotted IPv4 fills the last 4 bytes.
			if (ellipsis < 0 && n != 12) || n > 12 {
				return netip.Addr{}, false
			}
			if !parseIPv4(s, ip[n:n+4]) {
				return netip.Addr{}, false
			}
			n += 4
			s = ""
			break
		}
		ip[n], ip[n+1] = byte(val>>8), byte(val)
		n += 2
		s = s[off:]
		if len(s) == 0 {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return netip.Addr{}, false
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis >= 0 {
				return netip.Addr{}, false
			}
			ellipsis = n
			s = s[1:]
		}
	}
	if n < 16 {
		if ellipsis < 0 {
			return netip.Addr{}, false
		}
		// Move the groups after "::" to the end and zero the gap.
		gap := 16 - n
		copy(ip[ellipsis+gap:], ip[ellipsis:n])
		for i := ellipsis; i < ellipsis+gap; i++ {
			ip[i] = 0
		}
	} else if ellipsis >= 0 {
		return netip.Addr{}, false // "::" must stand for at least one group
	}
	return netip.AddrFrom16(ip), true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
