package rules

// Parsing of identity: how a client is identified (user id sources, API
// key, tenant, client IP) and who is exempt.

import (
	"encoding/base64"
	"strings"

	"github.com/tidwall/gjson"
)

func (p *parser) identity(v gjson.Result, path string) IdentityConfig {
	id := IdentityConfig{Anonymous: AnonymousIP}
	if !v.Exists() {
		return id
	}
	if !p.object(v, path, "sources", "api_key_header", "api_key_query", "tenant_header", "client_ip", "anonymous") {
		return id
	}
	if s := v.Get("sources"); s.Exists() {
		sp := join(path, "sources")
		if !s.IsArray() {
			p.fail(sp, "must be an array")
			return id
		}
		for i, e := range s.Array() {
			id.Sources = append(id.Sources, p.source(e, index(sp, i)))
		}
	}
	id.APIKeyHeader = p.headerName(v.Get("api_key_header"), join(path, "api_key_header"), "")
	id.APIKeyQuery = p.queryName(v.Get("api_key_query"), join(path, "api_key_query"))
	id.TenantHeader = p.headerName(v.Get("tenant_header"), join(path, "tenant_header"), "")
	id.ClientIP = p.clientIP(v.Get("client_ip"), join(path, "client_ip"))
	switch a := p.str(v.Get("anonymous"), join(path, "anonymous"), "ip"); a {
	case "ip":
		id.Anonymous = AnonymousIP
	case "shared":
		id.Anonymous = AnonymousShared
	default:
		p.fail(join(path, "anonymous"), `must be "ip" or "shared", got %q`, a)
	}
	return id
}

// headerName reads a header name and lower-cases it: proxies hand header
// maps to filters with lower-case names (HTTP/2 style).
func (p *parser) headerName(v gjson.Result, path, def string) string {
	s := p.str(v, path, def)
	if s == "" {
		return s
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			p.fail(path, "%q is not a valid header name", s)
			return def
		}
	}
	return strings.ToLower(s)
}

func (p *parser) source(v gjson.Result, path string) IdentitySource {
	var s IdentitySource
	if !p.object(v, path, "type", "header", "param", "claim", "keys", "issuer", "audiences", "leeway", "require_exp", "san") {
		return s
	}
	typ := p.str(v.Get("type"), join(path, "type"), "")
	if typ == "peer_certificate" {
		return p.peerSource(v, path)
	}
	if typ == "query" {
		return p.querySource(v, path)
	}
	if v.Get("param").Exists() && typ != "jwt" {
		p.fail(join(path, "param"), "only for types query and jwt")
	}
	if v.Get("san").Exists() {
		p.fail(join(path, "san"), "only for type peer_certificate")
	}
	switch typ {
	case "jwt":
		s.Kind = SourceJWT
		if pv := v.Get("param"); pv.Exists() {
			// A token in the URL, for clients that cannot set a header.
			if v.Get("header").Exists() {
				p.fail(join(path, "param"), "set header or param, not both")
			}
			if s.Param = p.queryName(pv, join(path, "param")); s.Param == "" && p.err == nil {
				p.fail(join(path, "param"), "must not be empty")
			}
			break
		}
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "authorization")
	case "jwt_payload":
		s.Kind = SourceJWTPayload
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	case "header":
		s.Kind = SourceHeader
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	default:
		p.fail(join(path, "type"), `must be "jwt", "jwt_payload", "header", "query" or "peer_certificate", got %q`, typ)
		return s
	}
	if s.Header == "" && s.Param == "" {
		p.fail(join(path, "header"), "is required for type %s", typ)
	}
	if s.Kind != SourceHeader {
		s.Claim = p.str(v.Get("claim"), join(path, "claim"), "sub")
		if s.Claim == "" {
			p.fail(join(path, "claim"), "must not be empty")
		}
	} else if v.Get("claim").Exists() {
		p.fail(join(path, "claim"), "only for types jwt and jwt_payload")
	}
	if s.Kind != SourceJWT {
		for _, f := range []string{"keys", "issuer", "audiences", "leeway", "require_exp"} {
			if v.Get(f).Exists() {
				p.fail(join(path, f), "only for type jwt (the plugin verifies the token itself)")
			}
		}
		return s
	}
	s.Issuer = p.str(v.Get("issuer"), join(path, "issuer"), "")
	s.Audiences = p.strings(v.Get("audiences"), join(path, "audiences"), nil)
	s.LeewaySec = p.duration(v.Get("leeway"), join(path, "leeway"), 30_000, 0, 3600_000) / 1000
	s.RequireExp = p.boolean(v.Get("require_exp"), join(path, "require_exp"), true)
	keys := v.Get("keys")
	kp := join(path, "keys")
	if !keys.IsArray() || len(keys.Array()) == 0 {
		p.fail(kp, "type jwt needs at least one verification key; without one a token could not be verified and would never identify anyone")
		return s
	}
	for i, k := range keys.Array() {
		s.Keys = append(s.Keys, p.jwtKey(k, index(kp, i)))
	}
	return s
}

// querySource reads a source of type query: a parameter of the request's
// query, which verifies nothing, as a header source does not.
func (p *parser) querySource(v gjson.Result, path string) IdentitySource {
	s := IdentitySource{Kind: SourceQuery}
	for _, f := range []string{"header", "claim", "keys", "issuer", "audiences", "leeway", "require_exp", "san"} {
		if v.Get(f).Exists() {
			p.fail(join(path, f), "not for type query (param names its parameter)")
		}
	}
	if s.Param = p.queryName(v.Get("param"), join(path, "param")); s.Param == "" && p.err == nil {
		p.fail(join(path, "param"), "is required for type query")
	}
	return s
}

// peerSource reads a source of type peer_certificate, which names no
// header and verifies nothing itself: the proxy verified the certificate.
func (p *parser) peerSource(v gjson.Result, path string) IdentitySource {
	s := IdentitySource{Kind: SourcePeerCertificate}
	for _, f := range []string{"header", "claim", "keys", "issuer", "audiences", "leeway", "require_exp"} {
		if v.Get(f).Exists() {
			p.fail(join(path, f), "not for type peer_certificate (the proxy verified the certificate; san picks its name)")
		}
	}
	switch san := p.str(v.Get("san"), join(path, "san"), "uri"); san {
	case "uri":
	case "dns":
		s.PeerDNS = true
	default:
		p.fail(join(path, "san"), `must be "uri" or "dns", got %q`, san)
	}
	return s
}

func (p *parser) jwtKey(v gjson.Result, path string) JWTKey {
	if !p.object(v, path, "kid", "alg", "secret", "secret_base64", "pem") {
		return JWTKey{}
	}
	alg := p.str(v.Get("alg"), join(path, "alg"), "")
	kid := p.str(v.Get("kid"), join(path, "kid"), "")
	var secret []byte
	if s := v.Get("secret"); s.Exists() {
		secret = []byte(p.str(s, join(path, "secret"), ""))
	}
	if s := v.Get("secret_base64"); s.Exists() {
		raw := p.str(s, join(path, "secret_base64"), "")
		b, err := base64.StdEncoding.DecodeString(raw)
		if err != nil {
			if b, err = base64.RawURLEncoding.DecodeString(raw); err != nil {
				p.fail(join(path, "secret_base64"), "is not base64")
			}
		}
		secret = b
	}
	pem := p.str(v.Get("pem"), join(path, "pem"), "")
	if p.err != nil {
		return JWTKey{}
	}
	k, err := ParseJWTKey(alg, kid, secret, pem)
	if err != nil {
		p.fail(path, "%v", err)
	}
	return k
}

func (p *parser) clientIP(v gjson.Result, path string) ClientIPConfig {
	c := ClientIPConfig{}
	if !v.Exists() {
		return c
	}
	if !p.object(v, path, "trusted_proxy_depth", "trusted_proxies", "use_x_real_ip") {
		return c
	}
	c.TrustedProxyDepth = int(p.integer(v.Get("trusted_proxy_depth"), join(path, "trusted_proxy_depth"), 0, 0, 32))
	tp := join(path, "trusted_proxies")
	for _, s := range p.strings(v.Get("trusted_proxies"), tp, nil) {
		pfx, err := ParseIPPrefix(s)
		if err != nil {
			p.fail(tp, "%q: %v", s, err)
			break
		}
		c.TrustedProxies = append(c.TrustedProxies, pfx)
	}
	c.UseXRealIP = p.boolean(v.Get("use_x_real_ip"), join(path, "use_x_real_ip"), false)
	return c
}

func (p *parser) exemptions(v gjson.Result, path string) Exemptions {
	var e Exemptions
	if !v.Exists() {
		return e
	}
	if !p.object(v, path, "ips", "users") {
		return e
	}
	ip := join(path, "ips")
	if ips := v.Get("ips"); ips.Exists() {
		if !ips.IsArray() {
			p.fail(ip, "must be an array of strings")
		}
		for i, s := range ips.Array() {
			pfx, err := ParseIPPrefix(s.Str)
			if s.Type != gjson.String || err != nil {
				p.fail(index(ip, i), "%s is not an IP address or CIDR", s.Raw)
				break
			}
			e.IPs = append(e.IPs, pfx)
		}
	}
	e.Users = p.strings(v.Get("users"), join(path, "users"), func(s, ep string) string {
		if s == "" {
			p.fail(ep, "must not be empty")
		}
		return s
	})
	return e
}
