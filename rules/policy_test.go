package rules

import (
	"net/netip"
	"strings"
	"testing"
)

// mapHeaders is a HeaderSource over lower-case names.
type mapHeaders map[string]string

func (m mapHeaders) Header(name string) string { return m[name] }

func mustConfig(t testing.TB, js string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const policyConfig = `{
  "identity": {
    "sources": [{"type": "header", "header": "x-user-id"}],
    "api_key_header": "x-api-key",
    "tenant_header": "x-tenant",
    "client_ip": {"trusted_proxy_depth": 1}
  },
  "tiers": {"header": "x-tier", "default": "free", "list": [
    {"name": "free", "limit": 100, "window": "1m"},
    {"name": "premium", "limit": 1000, "window": "1m", "endpoints": {"/api/v1/request": 50, "/api/v1/bulk/**": {"limit": 5, "window": "1h"}}},
    {"name": "unlimited", "unlimited": true}
  ]},
  "categories": [{"name": "chat", "paths": ["/api/v1/chat/**"]}, {"name": "auth", "paths": ["/api/v1/login"]}],
  "rules": [
    {"name": "writes", "match": {"methods": ["POST"], "paths": ["/api/**"]}, "scope": "tenant", "limit": 20, "window": "1s"},
    {"name": "beta", "match": {"hosts": ["*.beta.example.com"], "headers": [{"name": "x-canary", "present": true}]}, "scope": "global", "limit": 7, "window": "1s", "priority": 1},
    {"name": "keys", "match": {"headers": [{"name": "x-api-key", "present": true}]}, "scope": "api_key+endpoint", "limit": 3, "window": "1s"},
    {"name": "off", "enabled": false, "limit": 1, "window": "1s"}
  ],
  "exemptions": {"ips": ["10.0.0.0/8", "2001:db8::1"], "users": ["ops"]}
}`

func TestConfig_Evaluate(t *testing.T) {
	c := mustConfig(t, policyConfig)
	tests := []struct {
		name    string
		req     Request
		exempt  bool
		keys    []string
		perUser []bool
	}{
		{
			name: "anonymous free tier keyed by client ip from xff",
			req:  Request{Method: "GET", Path: "/api/v1/items?x=1", Source: "192.0.2.9:1234", Headers: mapHeaders{"x-forwarded-for": "6.6.6.6, 203.0.113.7"}},
			keys: []string{"rl:{a:203.0.113.7}:tier.free"}, perUser: []bool{true},
		},
		{
			name: "user premium endpoint override",
			req:  Request{Method: "GET", Path: "/api/v1/request", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "alice", "x-tier": "premium"}},
			keys: []string{"rl:{u:alice}:tier.premium.0"}, perUser: []bool{true},
		},
		{
			name: "premium second override by glob",
			req:  Request{Method: "GET", Path: "/api/v1/bulk/a/b", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "alice", "x-tier": "premium"}},
			keys: []string{"rl:{u:alice}:tier.premium.1"}, perUser: []bool{true},
		},
		{
			name: "unknown tier falls back to default",
			req:  Request{Method: "GET", Path: "/x", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "gold"}},
			keys: []string{"rl:{u:bob}:tier.free"}, perUser: []bool{true},
		},
		{
			name: "unlimited tier has no tier limit",
			req:  Request{Method: "GET", Path: "/x", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "unlimited"}},
		},
		{
			name: "category chat per user, auth per ip, rule by tenant",
			req:  Request{Method: "POST", Path: "/api/v1/chat/send", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "carol", "x-tenant": "acme"}},
			keys: []string{"rl:{t:acme}:writes", "rl:{u:carol}:chat", "rl:{u:carol}:tier.free"}, perUser: []bool{false, true, true},
		},
		{
			name: "auth category keyed by ip even for a user",
			req:  Request{Method: "GET", Path: "/api/v1/login", Source: "[2001:db8::7]:443", Headers: mapHeaders{"x-user-id": "carol"}},
			keys: []string{"rl:{ip:2001:db8::7}:auth", "rl:{u:carol}:tier.free"}, perUser: []bool{false, true},
		},
		{
			name: "host and header match, priority first",
			req:  Request{Method: "POST", Path: "/api/x", Host: "App.Beta.Example.com:8443", Source: "192.0.2.9:1", Headers: mapHeaders{"x-canary": "1", "x-tenant": "t1"}},
			keys: []string{"rl:{g}:beta", "rl:{t:t1}:writes", "rl:{a:192.0.2.9}:tier.free"}, perUser: []bool{false, false, true},
		},
		{
			name: "api key is never stored in clear",
			req:  Request{Method: "GET", Path: "/v", Source: "192.0.2.9:1", Headers: mapHeaders{"x-api-key": "sk_live_secret"}},
			keys: []string{"rl:{k:~", "rl:{a:192.0.2.9}:tier.free"}, perUser: []bool{false, true},
		},
		{name: "exempt ip", req: Request{Method: "GET", Path: "/x", Source: "10.1.2.3:1", Headers: mapHeaders{}}, exempt: true},
		{name: "exempt ipv6 in canonical form", req: Request{Method: "GET", Path: "/x", Source: "[2001:0db8:0:0::1]:1", Headers: mapHeaders{}}, exempt: true},
		{name: "exempt user", req: Request{Method: "GET", Path: "/x", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "ops"}}, exempt: true},
	}
	var plan Plan
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c.Evaluate(&tc.req, &plan)
			if plan.Exempt != tc.exempt {
				t.Fatalf("exempt: got %v", plan.Exempt)
			}
			if len(plan.Limits) != len(tc.keys) {
				var got []string
				for _, l := range plan.Limits {
					got = append(got, string(l.Key))
				}
				t.Fatalf("limits: got %q, want %q", got, tc.keys)
			}
			for i, l := range plan.Limits {
				if !strings.HasPrefix(string(l.Key), tc.keys[i]) {
					t.Errorf("key %d: got %q, want %q", i, l.Key, tc.keys[i])
				}
				if l.PerUser != tc.perUser[i] {
					t.Errorf("key %d: per_user %v", i, l.PerUser)
				}
			}
			if strings.Contains(string(plan.keys), "sk_live_secret") {
				t.Error("api key written in clear")
			}
		})
	}
}

func TestConfig_EvaluateDisabled(t *testing.T) {
	c := mustConfig(t, `{"enabled":false,"rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	var plan Plan
	c.Evaluate(&Request{Method: "GET", Path: "/", Source: "1.2.3.4:5", Headers: mapHeaders{}}, &plan)
	if len(plan.Limits) != 0 {
		t.Errorf("disabled config produced limits: %d", len(plan.Limits))
	}
}

func TestConfig_EvaluateHeaderInvert(t *testing.T) {
	c := mustConfig(t, `{"rules":[
		{"name":"no-auth","match":{"headers":[{"name":"authorization","present":false}]},"scope":"ip","limit":1,"window":"1s"},
		{"name":"not-prod","match":{"headers":[{"name":"x-env","equals":"prod","invert":true}]},"scope":"ip","limit":1,"window":"1s"}]}`)
	var plan Plan
	count := func(h mapHeaders) int {
		c.Evaluate(&Request{Method: "GET", Path: "/", Source: "1.2.3.4:5", Headers: h}, &plan)
		return len(plan.Limits)
	}
	if n := count(mapHeaders{}); n != 2 {
		t.Errorf("no headers: %d limits, want 2", n)
	}
	if n := count(mapHeaders{"authorization": "x", "x-env": "prod"}); n != 0 {
		t.Errorf("auth+prod: %d limits, want 0", n)
	}
	if n := count(mapHeaders{"authorization": "x", "x-env": "dev"}); n != 1 {
		t.Errorf("auth+dev: %d limits, want 1", n)
	}
}

func TestConfig_EvaluateAnonymousShared(t *testing.T) {
	c := mustConfig(t, `{"identity":{"anonymous":"shared"},"rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	var plan Plan
	c.Evaluate(&Request{Method: "GET", Path: "/", Source: "1.2.3.4:5", Headers: mapHeaders{}}, &plan)
	if got := string(plan.Limits[0].Key); got != "rl:{a}:r" {
		t.Errorf("shared anonymous key: %q", got)
	}
}

// A hostile user id cannot reach another client's counter or break out of
// its place in the key.
func TestConfig_EvaluateHostileIDs(t *testing.T) {
	c := mustConfig(t, `{"identity":{"sources":[{"type":"header","header":"x-user-id"}]},"rules":[{"name":"r","scope":"user+endpoint","limit":1,"window":"1s"}]}`)
	seen := map[string]string{}
	var plan Plan
	for _, id := range []string{"alice", "alice}:r", "{alice}", "alice:e:/", "~alice", strings.Repeat("a", 65), strings.Repeat("a", 64), "al\x00ice", "ALICE"} {
		c.Evaluate(&Request{Method: "GET", Path: "/p", Source: "1.2.3.4:5", Headers: mapHeaders{"x-user-id": id}}, &plan)
		key := string(plan.Limits[0].Key)
		if prev, dup := seen[key]; dup {
			t.Errorf("ids %q and %q share key %q", prev, id, key)
		}
		seen[key] = id
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || len(key) > 128 {
			t.Errorf("id %q made key %q", id, key)
		}
	}
}

func BenchmarkConfig_Evaluate(b *testing.B) {
	c := mustConfig(b, policyConfig)
	cases := []struct {
		name string
		req  Request
	}{
		{"anonymous", Request{Method: "GET", Path: "/api/v1/items?x=1", Source: "192.0.2.9:1234", Headers: mapHeaders{"x-forwarded-for": "6.6.6.6, 203.0.113.7"}}},
		{"user-category", Request{Method: "POST", Path: "/api/v1/chat/send", Source: "192.0.2.9:1", Headers: mapHeaders{"x-user-id": "carol", "x-tenant": "acme"}}},
		{"exempt", Request{Method: "GET", Path: "/x", Source: "10.1.2.3:1", Headers: mapHeaders{}}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var plan Plan
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				c.Evaluate(&tc.req, &plan)
			}
		})
	}
	// A request no rule matches, under the configuration of the gateway's
	// benchmark: what most requests of a proxy may cost.
	b.Run("no-match", func(b *testing.B) {
		c := mustConfig(b, `{"identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
			"rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 10, "window": "1h"}]}`)
		r := Request{Method: "GET", Path: "/health", Host: "x", Headers: mapHeaders{"x-user-id": "ua"}}
		var plan Plan
		b.ReportAllocs()
		for b.Loop() {
			c.Evaluate(&r, &plan)
		}
		if len(plan.Limits) != 0 {
			b.Fatal(plan.Limits)
		}
	})
}

// Clients without the identity a limit is kept per are counted as
// anonymous (by IP), not all together in one counter.
func TestConfig_EvaluateMissingIdentity(t *testing.T) {
	c := mustConfig(t, `{"identity":{"api_key_header":"x-api-key","tenant_header":"x-tenant"},"rules":[
		{"name":"k","scope":"api_key","limit":1,"window":"1s"},
		{"name":"t","scope":"tenant","limit":1,"window":"1s"}]}`)
	var plan Plan
	c.Evaluate(&Request{Method: "GET", Path: "/", Source: "192.0.2.1:5", Headers: mapHeaders{}}, &plan)
	if a, b := string(plan.Limits[0].Key), string(plan.Limits[1].Key); a != "rl:{a:192.0.2.1}:k" || b != "rl:{a:192.0.2.1}:t" {
		t.Errorf("keys without api key / tenant: %q %q", a, b)
	}
}

// Identity extraction and key building over hostile request headers: no
// panic, exactly one hash tag per key, keys bounded whatever the input.
func FuzzConfig_Evaluate(f *testing.F) {
	c, err := ParseConfig([]byte(policyConfig))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("GET", "/api/v1/chat/x?y", "api.beta.example.com", "1.2.3.4:5", "6.6.6.6, 203.0.113.7", "alice", "premium", "key", "acme")
	f.Add("POST", "/api/v1/login", "", "[::1]:80", "unknown,,, [2001:db8::1]:443", "}{:", "", "", "")
	f.Fuzz(func(t *testing.T, method, path, host, source, xff, user, tier, apiKey, tenant string) {
		h := mapHeaders{"x-forwarded-for": xff, "x-user-id": user, "x-tier": tier, "x-api-key": apiKey, "x-tenant": tenant, "x-canary": "1"}
		var plan Plan
		r := &Request{Method: method, Path: path, Host: host, Source: source, Headers: h}
		c.Evaluate(r, &plan)
		// The address worked out when needed is the one worked out eagerly.
		if got, want := c.ResolveClientIP(r, &plan), ClientIP(&c.Identity.ClientIP, xff, "", source); got != want || plan.Identity.IP != want {
			t.Fatalf("client IP %v (plan %v), want %v", got, plan.Identity.IP, want)
		}
		for _, l := range plan.Limits {
			k := string(l.Key)
			if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || len(k) > 300 || !strings.HasPrefix(k, "rl:{") {
				t.Fatalf("key %q", k)
			}
		}
	})
}

// countingLazy counts how often Evaluate asks for the lazy fields; its
// peer certificate names uri and dns.
type countingLazy struct {
	source, now, peer int
	uri, dns          string
}

func (l *countingLazy) Source() string { l.source++; return "192.0.2.9:1" }
func (l *countingLazy) NowUnix() int64 { l.now++; return 1_700_000_000 }
func (l *countingLazy) PeerName(dns bool) string {
	l.peer++
	if dns {
		return l.dns
	}
	return l.uri
}

// A peer_certificate source identifies a client by the name of the
// certificate the proxy verified: its URI, or with san dns its DNS name,
// asked for once and only for a request a limit applies to. Without one,
// the next source or the address identifies the client.
func TestConfig_EvaluatePeerCertificate(t *testing.T) {
	const spiffe = "spiffe://cluster.local/ns/shop/sa/checkout"
	for _, tt := range []struct {
		name, sources, path string
		lazy                countingLazy
		headers             mapHeaders
		key, source         string // key: the first limit's key, or its start
		asked               int
	}{
		{"its URI", `[{"type":"peer_certificate"}]`, "/api/x", countingLazy{uri: spiffe, dns: "checkout.shop"}, mapHeaders{},
			"rl:{u:~", "peer_certificate", 1}, // a user with "/" and ":" is hashed into the key
		{"its DNS name", `[{"type":"peer_certificate","san":"dns"}]`, "/api/x", countingLazy{uri: spiffe, dns: "checkout.shop"}, mapHeaders{},
			"rl:{u:checkout.shop}:r", "peer_certificate", 1},
		{"no certificate: the next source", `[{"type":"peer_certificate"},{"type":"header","header":"x-user-id"}]`, "/api/x",
			countingLazy{}, mapHeaders{"x-user-id": "alice"}, "rl:{u:alice}:r", "header", 1},
		{"no certificate: the address", `[{"type":"peer_certificate"}]`, "/api/x", countingLazy{dns: "checkout.shop"}, mapHeaders{},
			"rl:{a:192.0.2.9}:r", "", 1},
		{"a header first", `[{"type":"header","header":"x-user-id"},{"type":"peer_certificate"}]`, "/api/x",
			countingLazy{uri: spiffe}, mapHeaders{"x-user-id": "alice"}, "rl:{u:alice}:r", "header", 0},
		{"no limit applies", `[{"type":"peer_certificate"}]`, "/health", countingLazy{uri: spiffe}, mapHeaders{}, "", "", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := mustConfig(t, `{"identity":{"sources":`+tt.sources+`,"client_ip":{"trusted_proxy_depth":0}},
			  "rules":[{"name":"r","match":{"paths":["/api/**"]},"limit":1,"window":"1s"}]}`)
			var plan Plan
			lazy := tt.lazy
			c.Evaluate(&Request{Method: "GET", Path: tt.path, Headers: tt.headers, Lazy: &lazy}, &plan)
			key := ""
			if len(plan.Limits) > 0 {
				key = string(plan.Limits[0].Key)
			}
			if !strings.HasPrefix(key, tt.key) || (tt.key == "") != (key == "") || plan.IdentitySource != tt.source || lazy.peer != tt.asked {
				t.Errorf("key %q from %q, certificate asked for %d times; want %q from %q, %d", key, plan.IdentitySource, lazy.peer, tt.key, tt.source, tt.asked)
			}
			if tt.source == "peer_certificate" && plan.Identity.User != lazy.uri && plan.Identity.User != lazy.dns {
				t.Errorf("user %q, not a name of the certificate", plan.Identity.User)
			}
		})
	}
}

// A request no limit applies to costs no identity work: the lazy fields
// are not asked for. One that matches asks for the source once.
func TestConfig_EvaluateLazyFields(t *testing.T) {
	c := mustConfig(t, `{"identity":{"client_ip":{"trusted_proxy_depth":0}},
	  "rules":[{"name":"r","match":{"paths":["/api/**"]},"scope":"ip","limit":1,"window":"1s"}]}`)
	var plan Plan
	lazy := &countingLazy{}
	c.Evaluate(&Request{Method: "GET", Path: "/health", Headers: mapHeaders{}, Lazy: lazy}, &plan)
	if len(plan.Limits) != 0 || lazy.source != 0 || lazy.now != 0 {
		t.Fatalf("no match: limits %d, lazy %+v", len(plan.Limits), lazy)
	}
	c.Evaluate(&Request{Method: "GET", Path: "/api/x", Headers: mapHeaders{}, Lazy: lazy}, &plan)
	if len(plan.Limits) != 1 || lazy.source != 1 || plan.Identity.IP.String() != "192.0.2.9" {
		t.Fatalf("match: limits %d, lazy %+v, ip %v", len(plan.Limits), lazy, plan.Identity.IP)
	}
}

// A limit kept per user, for a request that names its user, needs no
// client address: Evaluate leaves it unresolved, and ResolveClientIP
// asks for the source once when something needs it after all. An IP
// exemption or an anonymous client needs it at once.
func TestConfig_EvaluateResolvesIPOnlyWhenNeeded(t *testing.T) {
	c := mustConfig(t, `{"identity":{"sources":[{"type":"header","header":"x-user-id"}],"client_ip":{"trusted_proxy_depth":0}},
	  "rules":[{"name":"r","match":{"paths":["/api/**"]},"limit":1,"window":"1s"}]}`)
	var plan Plan
	lazy := &countingLazy{}
	r := &Request{Method: "GET", Path: "/api/x", Headers: mapHeaders{"x-user-id": "alice"}, Lazy: lazy}
	c.Evaluate(r, &plan)
	if string(plan.Limits[0].Key) != "rl:{u:alice}:r" || lazy.source != 0 || plan.IPResolved() || plan.Identity.IP.IsValid() {
		t.Fatalf("by user: key %q, lazy %+v, resolved %v, ip %v", plan.Limits[0].Key, lazy, plan.IPResolved(), plan.Identity.IP)
	}
	for range 2 {
		if ip := c.ResolveClientIP(r, &plan); ip.String() != "192.0.2.9" || plan.Identity.IP != ip || lazy.source != 1 {
			t.Fatalf("resolved: %v, plan %v, lazy %+v", ip, plan.Identity.IP, lazy)
		}
	}
	anon := &Request{Method: "GET", Path: "/api/x", Headers: mapHeaders{}, Lazy: &countingLazy{}}
	c.Evaluate(anon, &plan)
	if string(plan.Limits[0].Key) != "rl:{a:192.0.2.9}:r" || !plan.IPResolved() {
		t.Fatalf("anonymous: key %q, resolved %v", plan.Limits[0].Key, plan.IPResolved())
	}
	c = mustConfig(t, `{"identity":{"sources":[{"type":"header","header":"x-user-id"}],"client_ip":{"trusted_proxy_depth":0}},
	  "exemptions":{"ips":["192.0.2.0/24"]}, "rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	c.Evaluate(r, &plan)
	if !plan.Exempt {
		t.Fatal("IP exemption not applied to a client keyed by user")
	}
}

// keyNeedsIP says exactly when AppendKey writes the client address.
func TestKeyNeedsIP(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	for s := 0; s < 1<<7; s++ {
		for ids := 0; ids < 8; ids++ {
			for _, anon := range []AnonymousMode{AnonymousIP, AnonymousShared} {
				id := Identity{}
				if ids&1 != 0 {
					id.User = "u"
				}
				if ids&2 != 0 {
					id.APIKey = "k"
				}
				if ids&4 != 0 {
					id.Tenant = "t"
				}
				withA, withB := id, id
				withA.IP, withB.IP = a, b
				differ := string(AppendKey(nil, "n", Scope(s), &withA, anon, "GET", "/p")) != string(AppendKey(nil, "n", Scope(s), &withB, anon, "GET", "/p"))
				if needs := keyNeedsIP(Scope(s), &id, anon); needs != differ {
					t.Errorf("scope %v, identity %+v, anonymous %v: keyNeedsIP %v, the key depends on the IP: %v", Scope(s), id, anon, needs, differ)
				}
			}
		}
	}
}

// Configurations MayApply can rule requests out under, and paths it rules
// out and does not.
var mayApplyConfigs = []struct {
	name, config string
	out, in      []string // paths MayApply is false and true for
}{
	{"rules and categories", `{"identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
	  "categories": [{"name": "chat", "paths": ["/api/v1/chat/**"], "limit": 5, "window": "1s"}, {"name": "login", "paths": ["/login"], "limit": 5, "window": "1s"}],
	  "rules": [
	    {"name": "writes", "match": {"methods": ["POST"], "paths": ["/api/**", "prefix:/up"]}, "limit": 20, "window": "1s"},
	    {"name": "beta", "match": {"hosts": ["*.beta.example.com"], "paths": ["/v2/*/items"], "headers": [{"name": "x-canary", "present": true}]}, "scope": "global", "limit": 7, "window": "1s"},
	    {"name": "off", "enabled": false, "limit": 1, "window": "1s"}],
	  "exemptions": {"ips": ["10.0.0.0/8"], "users": ["ops"]}}`,
		[]string{"/health", "/", "", "/ap", "/apix", "/login/x", "/v2/a/b/items", "/u", "?/api/x", "/health?/api/x"},
		[]string{"/api", "/api/x?y", "/upload", "/v2/a/items#f", "/login", "/login?next=/", "/api/v1/chat/send"}},
	{"a rule that names no paths", `{"rules": [{"name": "all", "match": {"methods": ["POST"]}, "limit": 1, "window": "1s"}]}`,
		nil, []string{"/health", "/", ""}},
	{"tiers", `{"tiers": {"header": "x-tier", "default": "free", "list": [{"name": "free", "limit": 100, "window": "1m"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 1, "window": "1s"}]}`,
		nil, []string{"/health", "/api/x"}},
	{"disabled", `{"enabled": false, "rules": [{"name": "all", "limit": 1, "window": "1s"}]}`,
		[]string{"/health", "/api/x"}, nil},
	{"no rules", `{}`, []string{"/health", "/"}, nil},
}

func TestConfig_MayApply(t *testing.T) {
	for _, tc := range mayApplyConfigs {
		c := mustConfig(t, tc.config)
		for _, p := range tc.out {
			if c.MayApply(p) {
				t.Errorf("%s: MayApply(%q) = true", tc.name, p)
			}
		}
		for _, p := range tc.in {
			if !c.MayApply(p) {
				t.Errorf("%s: MayApply(%q) = false", tc.name, p)
			}
		}
	}
}

// When MayApply is false, Evaluate gives the request no limits and no
// exemption, whatever its method, host, headers and address.
func FuzzConfig_MayApply(f *testing.F) {
	var configs []*Config
	for _, tc := range mayApplyConfigs {
		configs = append(configs, mustConfig(f, tc.config))
		for _, p := range append(tc.out, tc.in...) {
			f.Add(uint8(len(configs)-1), "POST", p, "a.beta.example.com", "10.1.2.3:5", "ops", "1")
		}
	}
	f.Fuzz(func(t *testing.T, ci uint8, method, path, host, source, user, canary string) {
		c := configs[int(ci)%len(configs)]
		if c.MayApply(path) {
			return
		}
		var plan Plan
		r := &Request{Method: method, Path: path, Host: host, Source: source,
			Headers: mapHeaders{"x-user-id": user, "x-canary": canary, "x-forwarded-for": source}}
		c.Evaluate(r, &plan)
		if len(plan.Limits) != 0 || plan.Exempt {
			t.Fatalf("MayApply(%q) = false, but Evaluate gives %d limits, exempt %v", path, len(plan.Limits), plan.Exempt)
		}
	})
}
