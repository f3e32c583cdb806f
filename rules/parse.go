package rules

import (
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// MaxConfigSize bounds the configuration a host may hand the plugin.
const MaxConfigSize = 1 << 20

// ConfigError is a configuration error at a field path such as rules[2].limit.
type ConfigError struct {
	Path string
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// ParseConfig parses and validates a plugin configuration (docs/config.md).
// It either returns a complete Config or an error naming the first bad
// field; unknown fields are errors, so a typo never silently disables a limit.
func ParseConfig(data []byte) (*Config, error) {
	if len(data) > MaxConfigSize {
		return nil, &ConfigError{Err: fmt.Errorf("configuration is %d bytes, more than %d", len(data), MaxConfigSize)}
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, &ConfigError{Err: errors.New("configuration is empty")}
	}
	if !gjson.ValidBytes(data) {
		return nil, &ConfigError{Err: errors.New("configuration is not valid JSON")}
	}
	root := gjson.ParseBytes(data)
	p := parser{}
	c := p.config(root)
	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

// parser keeps the first error; later calls become no-ops so that each
// parse step reads straight through without checking after every field.
type parser struct{ err error }

func (p *parser) fail(path, format string, args ...any) {
	if p.err == nil {
		p.err = &ConfigError{Path: path, Err: fmt.Errorf(format, args...)}
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// object checks v is an object with only the given fields.
func (p *parser) object(v gjson.Result, path string, fields ...string) bool {
	if p.err != nil {
		return false
	}
	if !v.IsObject() {
		p.fail(path, "must be an object")
		return false
	}
	v.ForEach(func(k, _ gjson.Result) bool {
		for _, f := range fields {
			if k.Str == f {
				return true
			}
		}
		p.fail(join(path, k.Str), "unknown field (known: %s)", strings.Join(fields, ", "))
		return false
	})
	return p.err == nil
}

func (p *parser) str(v gjson.Result, path, def string) string {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.String {
		p.fail(path, "must be a string")
		return def
	}
	return v.Str
}

func (p *parser) boolean(v gjson.Result, path string, def bool) bool {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.True && v.Type != gjson.False {
		p.fail(path, "must be true or false")
		return def
	}
	return v.Type == gjson.True
}

func (p *parser) integer(v gjson.Result, path string, def, lo, hi int64) int64 {
	if !v.Exists() {
		return def
	}
	n, ok := exactInt(v)
	if !ok {
		p.fail(path, "must be an integer")
		return def
	}
	if n < lo || n > hi {
		p.fail(path, "must be from %d to %d, got %d", lo, hi, n)
		return def
	}
	return n
}

func (p *parser) duration(v gjson.Result, path string, def, lo, hi int64) int64 {
	if !v.Exists() {
		return def
	}
	if v.Type != gjson.String {
		p.fail(path, `must be a duration string such as "30s", "1m", "1h"`)
		return def
	}
	ms, err := ParseDurationMS(v.Str)
	if err != nil {
		p.fail(path, "%v", err)
		return def
	}
	if ms < lo || ms > hi {
		p.fail(path, "must be from %s to %s, got %s", FormatDurationMS(lo), FormatDurationMS(hi), v.Str)
		return def
	}
	return ms
}

func (p *parser) strings(v gjson.Result, path string, each func(s, path string) string) []string {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array of strings")
		return nil
	}
	var out []string
	for i, e := range v.Array() {
		ep := index(path, i)
		if e.Type != gjson.String {
			p.fail(ep, "must be a string")
			return nil
		}
		s := e.Str
		if each != nil {
			s = each(s, ep)
		}
		out = append(out, s)
	}
	return out
}

func (p *parser) config(root gjson.Result) *Config {
	c := &Config{}
	if !p.object(root, "", "enabled", "failure_mode", "bridge", "identity", "tiers", "categories",
		"rules", "exemptions", "penalty", "headers", "deny", "local_cache") {
		return nil
	}
	c.Enabled = p.boolean(root.Get("enabled"), "enabled", true)
	switch fm := p.str(root.Get("failure_mode"), "failure_mode", "fail_open"); fm {
	case "fail_open":
		c.FailureMode = FailOpen
	case "fail_closed":
		c.FailureMode = FailClosed
	default:
		p.fail("failure_mode", `must be "fail_open" or "fail_closed", got %q`, fm)
	}
	c.Bridge = p.bridge(root.Get("bridge"), "bridge")
	c.Identity = p.identity(root.Get("identity"), "identity")
	c.Penalty = p.penalty(root.Get("penalty"), "penalty", nil)
	var defPenalty *Penalty
	if c.Penalty.Enabled {
		defPenalty = &c.Penalty
	}
	c.Tiers = p.tiers(root.Get("tiers"), "tiers", defPenalty)
	c.Categories = p.categories(root.Get("categories"), "categories", defPenalty)
	c.Rules = p.rules(root.Get("rules"), "rules", defPenalty)
	c.Exemptions = p.exemptions(root.Get("exemptions"), "exemptions")
	c.Headers = p.headers(root.Get("headers"), "headers")
	c.Deny = p.deny(root.Get("deny"), "deny")
	c.LocalCache = p.localCache(root.Get("local_cache"), "local_cache")
	if p.err != nil {
		return nil
	}
	p.checkNames(c)
	// Every limit that can apply to one request travels in one check.
	if n := len(c.Rules) + len(c.Categories) + 1; n > MaxLimitsPerCheck {
		p.fail("rules", "%d rules and categories: at most %d together, since all that match one request are checked in one call", n-1, MaxLimitsPerCheck-1)
	}
	if c.Tiers.Claim != "" && !hasJWTSource(c.Identity.Sources) {
		p.fail("tiers.claim", "needs an identity source of type jwt or jwt_payload to read the claim from")
	}
	return c
}

func hasJWTSource(srcs []IdentitySource) bool {
	for _, s := range srcs {
		if s.Kind == SourceJWT || s.Kind == SourceJWTPayload {
			return true
		}
	}
	return false
}

// checkNames makes sure no two limits share a counter name.
func (p *parser) checkNames(c *Config) {
	seen := map[string]string{}
	for i, r := range c.Rules {
		seen[r.Name] = index("rules", i)
	}
	for i, cat := range c.Categories {
		if prev, dup := seen[cat.Name]; dup {
			p.fail(index("categories", i)+".name", "%q is already the name of %s", cat.Name, prev)
			return
		}
		seen[cat.Name] = index("categories", i)
	}
}

func (p *parser) bridge(v gjson.Result, path string) Bridge {
	b := Bridge{Cluster: "sluice_bridge", Authority: "sluice-bridge", Path: "/v1/rate-limit/check", TimeoutMS: 200}
	if !v.Exists() {
		return b
	}
	if !p.object(v, path, "cluster", "authority", "path", "timeout", "token") {
		return b
	}
	b.Cluster = p.str(v.Get("cluster"), join(path, "cluster"), b.Cluster)
	if b.Cluster == "" {
		p.fail(join(path, "cluster"), "must not be empty")
	}
	b.Authority = p.str(v.Get("authority"), join(path, "authority"), b.Authority)
	b.Path = p.str(v.Get("path"), join(path, "path"), b.Path)
	if !strings.HasPrefix(b.Path, "/") {
		p.fail(join(path, "path"), `must start with "/"`)
	}
	b.TimeoutMS = uint32(p.duration(v.Get("timeout"), join(path, "timeout"), int64(b.TimeoutMS), 1, 60_000))
	b.Token = p.str(v.Get("token"), join(path, "token"), "")
	return b
}

func (p *parser) identity(v gjson.Result, path string) IdentityConfig {
	id := IdentityConfig{Anonymous: AnonymousIP}
	if !v.Exists() {
		return id
	}
	if !p.object(v, path, "sources", "api_key_header", "tenant_header", "client_ip", "anonymous") {
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
	if !p.object(v, path, "type", "header", "claim", "keys", "issuer", "audiences", "leeway", "require_exp") {
		return s
	}
	typ := p.str(v.Get("type"), join(path, "type"), "")
	switch typ {
	case "jwt":
		s.Kind = SourceJWT
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "authorization")
	case "jwt_payload":
		s.Kind = SourceJWTPayload
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	case "header":
		s.Kind = SourceHeader
		s.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	default:
		p.fail(join(path, "type"), `must be "jwt", "jwt_payload" or "header", got %q`, typ)
		return s
	}
	if s.Header == "" {
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

func (p *parser) penalty(v gjson.Result, path string, inherit *Penalty) Penalty {
	pen := Penalty{DetectionWindowMS: 3600_000, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4, 8}}
	if inherit != nil {
		pen = *inherit
	}
	if !v.Exists() {
		return pen
	}
	if !p.object(v, path, "enabled", "detection_window", "violation_threshold", "multipliers") {
		return pen
	}
	pen.Enabled = p.boolean(v.Get("enabled"), join(path, "enabled"), true)
	pen.DetectionWindowMS = p.duration(v.Get("detection_window"), join(path, "detection_window"), pen.DetectionWindowMS, 1000, MaxWindowMS)
	pen.ViolationThreshold = p.integer(v.Get("violation_threshold"), join(path, "violation_threshold"), pen.ViolationThreshold, 1, MaxViolations)
	if m := v.Get("multipliers"); m.Exists() {
		mp := join(path, "multipliers")
		arr := m.Array()
		if !m.IsArray() || len(arr) == 0 || len(arr) > MaxMultipliers {
			p.fail(mp, "must be an array of 1 to %d integers", MaxMultipliers)
			return pen
		}
		pen.Multipliers = make([]int64, len(arr))
		for i, e := range arr {
			pen.Multipliers[i] = p.integer(e, index(mp, i), 1, 1, MaxMultiplier)
			if e.Type != gjson.Number {
				p.fail(index(mp, i), "must be an integer")
			}
			if i > 0 && pen.Multipliers[i] < pen.Multipliers[i-1] {
				p.fail(index(mp, i), "must not be smaller than the one before: penalties only lengthen")
			}
		}
	}
	return pen
}

// limitFields are the fields every limit-bearing object shares.
var limitFields = []string{"algorithm", "limit", "window", "burst", "cost", "penalty"}

// limitSpec reads the limit fields of v; def supplies inherited values.
func (p *parser) limitSpec(v gjson.Result, path string, def LimitSpec, defPenalty *Penalty) LimitSpec {
	s := def
	if a := v.Get("algorithm"); a.Exists() || s.Algorithm == 0 {
		name := p.str(a, join(path, "algorithm"), "sliding_window")
		alg, ok := ParseAlgorithm(name)
		if !ok {
			p.fail(join(path, "algorithm"), "must be one of token_bucket, sliding_window, sliding_log, fixed_window; got %q", name)
		}
		s.Algorithm = alg
	}
	s.Limit = p.integer(v.Get("limit"), join(path, "limit"), s.Limit, 1, MaxLimitValue)
	if s.Limit == 0 && p.err == nil {
		p.fail(join(path, "limit"), "is required (requests per window, > 0)")
	}
	s.WindowMS = p.duration(v.Get("window"), join(path, "window"), s.WindowMS, 1, MaxWindowMS)
	if s.WindowMS == 0 && p.err == nil {
		p.fail(join(path, "window"), `is required (a duration such as "1m")`)
	}
	if b := v.Get("burst"); b.Exists() {
		if s.Algorithm != TokenBucket {
			p.fail(join(path, "burst"), "only for algorithm token_bucket (the bucket capacity)")
		}
		s.Burst = p.integer(b, join(path, "burst"), 0, 1, MaxLimitValue)
	} else if s.Algorithm != TokenBucket || s.Burst == 0 {
		// Only a token bucket has a capacity apart from its rate.
		s.Burst = s.Limit
	}
	s.Cost = p.integer(v.Get("cost"), join(path, "cost"), max(s.Cost, 1), 1, MaxLimitValue)
	if capacity := max(s.Limit, s.Burst); s.Cost > capacity && p.err == nil {
		p.fail(join(path, "cost"), "is %d, more than the limit %d: no request could ever pass", s.Cost, capacity)
	}
	if pv := v.Get("penalty"); pv.Exists() {
		pen := p.penalty(pv, join(path, "penalty"), defPenalty)
		if pen.Enabled {
			s.Penalty = &pen
		} else {
			s.Penalty = nil
		}
	} else if def.Penalty == nil {
		s.Penalty = defPenalty
	}
	return s
}

// scope parses "user+endpoint".
func (p *parser) scope(v gjson.Result, path, def string) Scope {
	text := p.str(v, path, def)
	var s Scope
	for _, part := range strings.Split(text, "+") {
		found := false
		for _, n := range scopePartNames {
			if n.name == strings.TrimSpace(part) {
				if s.Has(n.part) {
					p.fail(path, "%q names %s twice", text, n.name)
				}
				s |= Scope(n.part)
				found = true
			}
		}
		if !found {
			p.fail(path, "unknown scope %q in %q (known: global, ip, user, api_key, tenant, endpoint, method, joined with +)", part, text)
			return s
		}
	}
	if s.Has(ScopeGlobal) && s != Scope(ScopeGlobal) {
		p.fail(path, "global cannot be combined with other parts")
	}
	return s
}

func (p *parser) action(v gjson.Result, path string) Action {
	switch a := p.str(v, path, "reject"); a {
	case "reject":
		return Reject
	case "log_only":
		return LogOnly
	default:
		p.fail(path, `must be "reject" or "log_only", got %q`, a)
	}
	return Reject
}

// name validates a rule, category or tier name: it becomes part of counter
// keys, metric labels and header values.
func (p *parser) name(v gjson.Result, path string) string {
	n := p.str(v, path, "")
	if n == "" {
		if p.err == nil {
			p.fail(path, "is required")
		}
		return n
	}
	if len(n) > MaxRuleNameLen {
		p.fail(path, "must be at most %d bytes", MaxRuleNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			p.fail(path, "%q may hold only a-z, 0-9, _ and -", n)
			break
		}
	}
	return n
}

func (p *parser) pathPatterns(v gjson.Result, path string) []PathPattern {
	var out []PathPattern
	for _, s := range p.strings(v, path, nil) {
		pp, err := ParsePathPattern(s)
		if err != nil {
			p.fail(path, "%q: %v", s, err)
			return nil
		}
		out = append(out, pp)
	}
	return out
}

func (p *parser) rules(v gjson.Result, path string, defPenalty *Penalty) []Rule {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array")
		return nil
	}
	var out []Rule
	fields := append([]string{"name", "match", "scope", "action", "priority", "enabled"}, limitFields...)
	for i, e := range v.Array() {
		rp := index(path, i)
		if !p.object(e, rp, fields...) {
			return nil
		}
		r := Rule{
			Name:     p.name(e.Get("name"), join(rp, "name")),
			Match:    p.match(e.Get("match"), join(rp, "match")),
			Scope:    p.scope(e.Get("scope"), join(rp, "scope"), "user"),
			Action:   p.action(e.Get("action"), join(rp, "action")),
			Priority: int(p.integer(e.Get("priority"), join(rp, "priority"), 100, -1_000_000, 1_000_000)),
			Enabled:  p.boolean(e.Get("enabled"), join(rp, "enabled"), true),
		}
		r.Spec = p.limitSpec(e, rp, LimitSpec{}, defPenalty)
		for j := range out {
			if out[j].Name == r.Name && p.err == nil {
				p.fail(join(rp, "name"), "%q is already the name of %s", r.Name, index(path, j))
			}
		}
		out = append(out, r)
	}
	// Lower priority first; config order breaks ties.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Priority < out[j].Priority })
	return out
}

func (p *parser) match(v gjson.Result, path string) Match {
	var m Match
	if !v.Exists() {
		return m
	}
	if !p.object(v, path, "paths", "methods", "hosts", "headers") {
		return m
	}
	m.Paths = p.pathPatterns(v.Get("paths"), join(path, "paths"))
	m.Methods = p.strings(v.Get("methods"), join(path, "methods"), func(s, ep string) string {
		s = strings.ToUpper(s)
		if s == "" || strings.ContainsAny(s, " \t\r\n") {
			p.fail(ep, "%q is not an HTTP method", s)
		}
		return s
	})
	m.Hosts = p.strings(v.Get("hosts"), join(path, "hosts"), func(s, ep string) string {
		s = strings.ToLower(s)
		if err := ValidHostPattern(s); err != nil {
			p.fail(ep, "%v", err)
		}
		return s
	})
	if h := v.Get("headers"); h.Exists() {
		hp := join(path, "headers")
		if !h.IsArray() {
			p.fail(hp, "must be an array")
			return m
		}
		for i, e := range h.Array() {
			ep := index(hp, i)
			if !p.object(e, ep, "name", "present", "equals", "invert") {
				return m
			}
			hm := HeaderMatch{Name: p.headerName(e.Get("name"), join(ep, "name"), "")}
			if hm.Name == "" && p.err == nil {
				p.fail(join(ep, "name"), "is required")
			}
			pres, eq := e.Get("present"), e.Get("equals")
			switch {
			case pres.Exists() && eq.Exists():
				p.fail(ep, "set either present or equals, not both")
			case eq.Exists():
				hm.Value = p.str(eq, join(ep, "equals"), "")
			case pres.Exists():
				hm.Present = true
				if !p.boolean(pres, join(ep, "present"), true) {
					// present: false means "absent": presence, inverted.
					hm.Invert = true
				}
			default:
				p.fail(ep, "needs present or equals")
			}
			if p.boolean(e.Get("invert"), join(ep, "invert"), false) {
				hm.Invert = !hm.Invert
			}
			m.Headers = append(m.Headers, hm)
		}
	}
	return m
}

// Seed defaults for well-known categories (seed 003).
var categoryDefaults = map[string]struct {
	limit, windowMS int64
	scope           Scope
}{
	"chat":   {10, 60_000, Scope(ScopeUser)},
	"upload": {2, 600_000, Scope(ScopeUser)},
	"auth":   {5, 60_000, Scope(ScopeIP)},
}

func (p *parser) categories(v gjson.Result, path string, defPenalty *Penalty) []Category {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array")
		return nil
	}
	var out []Category
	fields := append([]string{"name", "paths", "scope", "action"}, limitFields...)
	for i, e := range v.Array() {
		cp := index(path, i)
		if !p.object(e, cp, fields...) {
			return nil
		}
		c := Category{Name: p.name(e.Get("name"), join(cp, "name"))}
		def := LimitSpec{}
		defScope := "user"
		if d, ok := categoryDefaults[c.Name]; ok {
			def = LimitSpec{Algorithm: SlidingWindow, Limit: d.limit, WindowMS: d.windowMS, Burst: d.limit, Cost: 1}
			defScope = d.scope.String()
		}
		c.Paths = p.pathPatterns(e.Get("paths"), join(cp, "paths"))
		if len(c.Paths) == 0 && p.err == nil {
			p.fail(join(cp, "paths"), "needs at least one path pattern")
		}
		c.Scope = p.scope(e.Get("scope"), join(cp, "scope"), defScope)
		c.Action = p.action(e.Get("action"), join(cp, "action"))
		c.Spec = p.limitSpec(e, cp, def, defPenalty)
		for j := range out {
			if out[j].Name == c.Name && p.err == nil {
				p.fail(join(cp, "name"), "%q is already the name of %s", c.Name, index(path, j))
			}
		}
		out = append(out, c)
	}
	return out
}

func (p *parser) tiers(v gjson.Result, path string, defPenalty *Penalty) TierConfig {
	var t TierConfig
	if !v.Exists() {
		return t
	}
	if !p.object(v, path, "header", "claim", "default", "list") {
		return t
	}
	t.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	t.Claim = p.str(v.Get("claim"), join(path, "claim"), "")
	lp := join(path, "list")
	list := v.Get("list")
	if !list.IsArray() || len(list.Array()) == 0 {
		p.fail(lp, "must be a non-empty array of tiers")
		return t
	}
	fields := append([]string{"name", "unlimited", "scope", "endpoints"}, limitFields...)
	for i, e := range list.Array() {
		tp := index(lp, i)
		if !p.object(e, tp, fields...) {
			return t
		}
		tier := Tier{Name: p.name(e.Get("name"), join(tp, "name"))}
		tier.Unlimited = p.boolean(e.Get("unlimited"), join(tp, "unlimited"), false)
		tier.Scope = p.scope(e.Get("scope"), join(tp, "scope"), "user")
		if tier.Unlimited {
			for _, f := range append([]string{"endpoints"}, limitFields...) {
				if e.Get(f).Exists() {
					p.fail(join(tp, f), "an unlimited tier has no limits")
				}
			}
		} else {
			tier.Spec = p.limitSpec(e, tp, LimitSpec{}, defPenalty)
			tier.Endpoints = p.endpointOverrides(e.Get("endpoints"), join(tp, "endpoints"), tier.Spec, defPenalty)
		}
		for j := range t.List {
			if t.List[j].Name == tier.Name && p.err == nil {
				p.fail(join(tp, "name"), "%q is already the name of %s", tier.Name, index(lp, j))
			}
		}
		t.List = append(t.List, tier)
	}
	t.Default = p.str(v.Get("default"), join(path, "default"), "")
	if p.err != nil {
		return t
	}
	if t.Default == "" {
		t.Default = t.List[0].Name
	} else if t.Find(t.Default) == nil {
		p.fail(join(path, "default"), "%q is not one of the tiers in list", t.Default)
	}
	t.setKeyNames()
	return t
}

// endpointOverrides reads {"/path": 50} or {"/path": {"limit": 50, "window": "1m"}}.
func (p *parser) endpointOverrides(v gjson.Result, path string, base LimitSpec, defPenalty *Penalty) []EndpointOverride {
	if !v.Exists() {
		return nil
	}
	if !v.IsObject() {
		p.fail(path, `must be an object of path pattern to limit, e.g. {"/api/v1/search": 50}`)
		return nil
	}
	var out []EndpointOverride
	v.ForEach(func(k, e gjson.Result) bool {
		ep := path + "[" + strconv.Quote(k.Str) + "]"
		pp, err := ParsePathPattern(k.Str)
		if err != nil {
			p.fail(ep, "%v", err)
			return false
		}
		o := EndpointOverride{Match: pp}
		if e.Type == gjson.Number {
			o.Spec = base
			o.Spec.Limit = p.integer(e, ep, 0, 1, MaxLimitValue)
			if base.Algorithm == TokenBucket && base.Burst == base.Limit {
				o.Spec.Burst = o.Spec.Limit
			} else if base.Algorithm != TokenBucket {
				o.Spec.Burst = o.Spec.Limit
			}
			if o.Spec.Cost > max(o.Spec.Limit, o.Spec.Burst) {
				p.fail(ep, "is %d, less than the cost %d: no request could ever pass", o.Spec.Limit, o.Spec.Cost)
			}
		} else {
			if !p.object(e, ep, limitFields...) {
				return false
			}
			inherited := base
			if e.Get("limit").Exists() {
				inherited.Burst = 0 // recomputed from the new limit unless given
			}
			o.Spec = p.limitSpec(e, ep, inherited, defPenalty)
		}
		out = append(out, o)
		return p.err == nil
	})
	return out
}

func (p *parser) headers(v gjson.Result, path string) HeaderConfig {
	h := HeaderConfig{Prefix: "X-RateLimit-", RetryAfter: true}
	if v.Exists() && p.object(v, path, "enabled", "prefix", "strategy", "draft", "retry_after") {
		h.Disabled = !p.boolean(v.Get("enabled"), join(path, "enabled"), true)
		h.Prefix = p.str(v.Get("prefix"), join(path, "prefix"), h.Prefix)
		for i := 0; i < len(h.Prefix); i++ {
			c := h.Prefix[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				p.fail(join(path, "prefix"), "%q is not a valid header name prefix", h.Prefix)
				break
			}
		}
		h.Strategy = p.boolean(v.Get("strategy"), join(path, "strategy"), false)
		h.Draft = p.boolean(v.Get("draft"), join(path, "draft"), false)
		h.RetryAfter = p.boolean(v.Get("retry_after"), join(path, "retry_after"), true)
	}
	h.compile()
	return h
}

func (p *parser) deny(v gjson.Result, path string) DenyConfig {
	d := DenyConfig{Status: 429, FailClosedStatus: 503}
	if !v.Exists() || !p.object(v, path, "status", "message", "fail_closed_status") {
		return d
	}
	d.Status = uint32(p.integer(v.Get("status"), join(path, "status"), 429, 400, 599))
	d.Message = p.str(v.Get("message"), join(path, "message"), "")
	if len(d.Message) > 1024 {
		p.fail(join(path, "message"), "must be at most 1024 bytes")
	}
	d.FailClosedStatus = uint32(p.integer(v.Get("fail_closed_status"), join(path, "fail_closed_status"), 503, 400, 599))
	return d
}

func (p *parser) localCache(v gjson.Result, path string) LocalCacheConfig {
	c := LocalCacheConfig{Enabled: true, MaxEntries: 10_000}
	if !v.Exists() || !p.object(v, path, "enabled", "max_entries") {
		return c
	}
	c.Enabled = p.boolean(v.Get("enabled"), join(path, "enabled"), true)
	c.MaxEntries = p.integer(v.Get("max_entries"), join(path, "max_entries"), c.MaxEntries, 1, 1_000_000)
	return c
}

// Find returns the tier with the given name, or nil.
func (t *TierConfig) Find(name string) *Tier {
	for i := range t.List {
		if t.List[i].Name == name {
			return &t.List[i]
		}
	}
	return nil
}

// ParseDurationMS parses "250ms", "30s", "1m", "1h", "1d" (and combinations
// such as "1m30s") into milliseconds. Sub-millisecond precision is refused
// rather than rounded.
func ParseDurationMS(s string) (int64, error) {
	if s == "" {
		return 0, errors.New(`empty duration (use e.g. "30s", "1m")`)
	}
	var total int64
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 12 {
			return 0, fmt.Errorf("invalid duration %q (use e.g. \"500ms\", \"30s\", \"1m\", \"1h\", \"1d\")", s)
		}
		n, _ := strconv.ParseInt(rest[:i], 10, 64)
		rest = rest[i:]
		j := 0
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') {
			j++
		}
		var unit int64
		switch rest[:j] {
		case "ms":
			unit = 1
		case "s":
			unit = 1000
		case "m":
			unit = 60_000
		case "h":
			unit = 3600_000
		case "d":
			unit = 86400_000
		default:
			return 0, fmt.Errorf("invalid duration %q: unit %q (use ms, s, m, h or d)", s, rest[:j])
		}
		rest = rest[j:]
		total += n * unit
		if total > MaxWindowMS*10 {
			return 0, fmt.Errorf("duration %q is too long", s)
		}
	}
	return total, nil
}

// FormatDurationMS renders ms in the largest whole unit: 60000 → "1m".
func FormatDurationMS(ms int64) string { return string(AppendDurationMS(nil, ms)) }

// AppendDurationMS appends ms as FormatDurationMS does.
func AppendDurationMS(dst []byte, ms int64) []byte {
	for _, u := range [...]struct {
		n    int64
		unit byte
	}{{86400_000, 'd'}, {3600_000, 'h'}, {60_000, 'm'}, {1000, 's'}} {
		if ms >= u.n && ms%u.n == 0 {
			return append(strconv.AppendInt(dst, ms/u.n, 10), u.unit)
		}
	}
	return append(strconv.AppendInt(dst, ms, 10), "ms"...)
}
