package rules

import (
	"crypto/sha256"
	"net/netip"
)

// Identity is who a request comes from, as far as the plugin could establish.
type Identity struct {
	User   string     // verified JWT claim or trusted user header; "" when anonymous
	APIKey string     // raw API key; never written to a key in clear
	Tenant string     // tenant id
	IP     netip.Addr // client address, unmapped (IPv4 for ::ffff:a.b.c.d); in a Plan, see Config.ResolveClientIP
	Tier   string     // resolved tier name
}

// Counter keys look like
//
//	rl:{u:alice}:chat               per user
//	rl:{ip:2001:db8::1}:auth         per IP
//	rl:{u:alice}:api:e:/v1/search    per user and endpoint
//	rl:{g}:all                       global
//
// The part in braces is the Redis Cluster hash tag: it is the counter's
// principal identity, so every limit kept for one client lands in one slot
// and the bridge decides them in a single script call. Kinds: g global,
// u user, a anonymous (user scope without a user: by IP), k API key,
// t tenant, ip, e endpoint, m method. A client without the identity a
// user, api_key or tenant limit is kept per is counted as anonymous.
//
// Identifiers come from clients, so they are written verbatim only when
// short and made of safe bytes; anything else becomes "~" and 32 hex digits
// of its SHA-256. "~" is not a safe byte, so an escaped id never equals a
// verbatim one, and no id can inject ":", "{" or "}" into the key.

const maxVerbatimID = 64

// idSafe marks the bytes an id may keep verbatim.
var idSafe = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "._-@/+=" {
		t[c] = true
	}
	return t
}()

// AppendKey appends the counter key for a limit named name with scope s to dst.
// Anonymous clients of a user-scoped limit are counted by IP, or all together
// when mode is AnonymousShared.
func AppendKey(dst []byte, name string, s Scope, id *Identity, anon AnonymousMode, method, path string) []byte {
	dst = append(dst, "rl:{"...)
	// The first identity part present is the hash tag.
	tagged := ScopePart(0)
	switch {
	case s.Has(ScopeUser):
		tagged = ScopeUser
		if id.User != "" {
			dst = AppendID(append(dst, "u:"...), id.User)
		} else {
			dst = appendAnonymous(dst, id, anon)
		}
	case s.Has(ScopeAPIKey):
		tagged = ScopeAPIKey
		if id.APIKey != "" {
			dst = appendHashedID(append(dst, "k:"...), id.APIKey)
		} else {
			dst = appendAnonymous(dst, id, anon)
		}
	case s.Has(ScopeTenant):
		tagged = ScopeTenant
		if id.Tenant != "" {
			dst = AppendID(append(dst, "t:"...), id.Tenant)
		} else {
			dst = appendAnonymous(dst, id, anon)
		}
	case s.Has(ScopeIP):
		tagged = ScopeIP
		dst = appendIP(append(dst, "ip:"...), id.IP)
	case s.Has(ScopeEndpoint):
		tagged = ScopeEndpoint
		dst = AppendID(append(dst, "e:"...), path)
	case s.Has(ScopeMethod):
		tagged = ScopeMethod
		dst = AppendID(append(dst, "m:"...), method)
	default:
		dst = append(dst, 'g')
	}
	dst = append(dst, "}:"...)
	dst = append(dst, name...)
	// Remaining parts follow the name in a fixed order.
	if s.Has(ScopeAPIKey) && tagged != ScopeAPIKey {
		dst = appendHashedID(append(dst, ":k:"...), id.APIKey)
	}
	if s.Has(ScopeTenant) && tagged != ScopeTenant {
		dst = AppendID(append(dst, ":t:"...), id.Tenant)
	}
	if s.Has(ScopeIP) && tagged != ScopeIP {
		dst = appendIP(append(dst, ":ip:"...), id.IP)
	}
	if s.Has(ScopeEndpoint) && tagged != ScopeEndpoint {
		dst = AppendID(append(dst, ":e:"...), path)
	}
	if s.Has(ScopeMethod) && tagged != ScopeMethod {
		dst = AppendID(append(dst, ":m:"...), method)
	}
	return dst
}

// keyNeedsIP reports whether AppendKey writes id.IP into the key of a
// limit with scope s: per-IP limits, and limits kept per an identity the
// client lacks, which fall back to its address.
func keyNeedsIP(s Scope, id *Identity, anon AnonymousMode) bool {
	if s.Has(ScopeIP) {
		return true
	}
	var missing bool
	switch {
	case s.Has(ScopeUser):
		missing = id.User == ""
	case s.Has(ScopeAPIKey):
		missing = id.APIKey == ""
	case s.Has(ScopeTenant):
		missing = id.Tenant == ""
	}
	return missing && anon != AnonymousShared
}

// appendAnonymous writes the tag of a client that lacks the identity a
// limit is kept per: its IP, or one shared "a" for all such clients. So a
// request without an API key never lands in one counter with every other
// keyless request, unless the config asks for that.
func appendAnonymous(dst []byte, id *Identity, anon AnonymousMode) []byte {
	if anon == AnonymousShared || !id.IP.IsValid() {
		return append(dst, 'a')
	}
	return id.IP.AppendTo(append(dst, "a:"...))
}

func appendIP(dst []byte, ip netip.Addr) []byte {
	if !ip.IsValid() {
		return append(dst, '-')
	}
	return ip.AppendTo(dst)
}

// AppendID appends id to a counter key as AppendKey writes the
// identifiers clients give: verbatim when short and made of safe bytes,
// else "~" and a hash; never ":", "{" or "}". Empty is "-".
func AppendID(dst []byte, id string) []byte {
	if len(id) == 0 {
		return append(dst, '-')
	}
	if len(id) <= maxVerbatimID {
		safe := true
		for i := 0; i < len(id); i++ {
			if !idSafe[id[i]] {
				safe = false
				break
			}
		}
		if safe {
			return append(dst, id...)
		}
	}
	return appendHashedID(dst, id)
}

// appendHashedID writes "~" and the first 16 bytes of SHA-256(id) in hex:
// collision-resistant even against ids chosen by an attacker.
func appendHashedID(dst []byte, id string) []byte {
	sum := sha256.Sum256([]byte(id))
	dst = append(dst, '~')
	for _, b := range sum[:16] {
		dst = append(dst, hexDigits[b>>4], hexDigits[b&0xf])
	}
	return dst
}

// HashTag returns the hash tag part of a key ("u:alice" for "rl:{u:alice}:x"),
// the way Redis Cluster picks it: the text between the first "{" and the
// next "}", when non-empty; otherwise the whole key.
func HashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j == i+1 {
						return key
					}
					return key[i+1 : j]
				}
			}
			return key
		}
	}
	return key
}
