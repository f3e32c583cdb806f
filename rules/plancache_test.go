package rules

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
)

// planValue is what a Plan tells its user, for comparing whole plans.
func planValue(p *Plan) any {
	type limit struct {
		Key, Rule  string
		Spec       *LimitSpec
		Action     Action
		PerUser    bool
		MaxDelayMS int64
		AskLease   bool
		Return     LeaseReturn
		OnResponse *OnResponse
	}
	v := struct {
		Exempt                   bool
		Identity                 Identity
		IdentitySource, Endpoint string
		JWTError                 error
		IPResolved               bool
		Limits                   []limit
	}{p.Exempt, p.Identity, p.IdentitySource, p.Endpoint, p.JWTError, p.ipResolved, nil}
	for _, l := range p.Limits {
		v.Limits = append(v.Limits, limit{string(l.Key), l.Rule, l.Spec, l.Action, l.PerUser, l.MaxDelayMS, l.AskLease, l.Return, l.OnResponse})
	}
	return v
}

func evaluated(c *Config, r Request) *Plan {
	var p Plan
	c.Evaluate(&r, &p)
	return &p
}

func TestPlanCache_Lookup(t *testing.T) {
	c := mustConfig(t, policyConfig)
	base := Request{Method: "POST", Path: "/api/v1/chat/send", Host: "api.example.com", Source: "192.0.2.9:1",
		Headers: mapHeaders{"x-user-id": "carol", "x-tenant": "acme", "x-unrelated": "1"}}
	with := func(f func(r *Request)) Request {
		r := base
		h := mapHeaders{}
		for k, v := range base.Headers.(mapHeaders) {
			h[k] = v
		}
		r.Headers = h
		f(&r)
		return r
	}
	var pc PlanCache
	var plan Plan
	r := base
	pc.Evaluate(c, &r, &plan)
	if !reflect.DeepEqual(planValue(&plan), planValue(evaluated(c, base))) {
		t.Fatalf("evaluating through the cache: %+v, want %+v", planValue(&plan), planValue(evaluated(c, base)))
	}
	pc.Keep(c, &r, &plan, 42)
	tests := []struct {
		name string
		req  Request
		cfg  *Config
		hit  bool
	}{
		{"the same request", base, c, true},
		{"a header it did not read", with(func(r *Request) { r.Headers.(mapHeaders)["x-unrelated"] = "2" }), c, true},
		{"the query string", with(func(r *Request) { r.Path += "?page=2" }), c, false},
		{"another user", with(func(r *Request) { r.Headers.(mapHeaders)["x-user-id"] = "dave" }), c, false},
		{"another tenant", with(func(r *Request) { r.Headers.(mapHeaders)["x-tenant"] = "umbrella" }), c, false},
		{"a header it read as absent", with(func(r *Request) { r.Headers.(mapHeaders)["x-tier"] = "premium" }), c, false},
		{"another method", with(func(r *Request) { r.Method = "GET" }), c, false},
		{"another host", with(func(r *Request) { r.Host = "api.beta.example.com" }), c, false},
		{"another path", with(func(r *Request) { r.Path = "/api/v1/chat/sent" }), c, false},
		{"another config", base, mustConfig(t, policyConfig), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.req
			kept, tag, ok := pc.Lookup(tt.cfg, &r)
			if ok != tt.hit {
				t.Fatalf("hit %v, want %v", ok, tt.hit)
			}
			if !ok {
				return
			}
			if tag != 42 {
				t.Errorf("tag %d, want 42", tag)
			}
			if got, want := planValue(kept), planValue(evaluated(tt.cfg, tt.req)); !reflect.DeepEqual(got, want) {
				t.Errorf("kept plan %+v, want %+v", got, want)
			}
		})
	}
}

// A plan keyed by address read the address: another address misses.
func TestPlanCache_LookupSource(t *testing.T) {
	c := mustConfig(t, `{"identity":{"client_ip":{"trusted_proxy_depth":1}},
	  "rules":[{"name":"r","match":{"paths":["/api/**"]},"scope":"ip","limit":1,"window":"1s"}]}`)
	var pc PlanCache
	var plan Plan
	lazy := &countingLazy{}
	r := Request{Method: "GET", Path: "/api/x", Headers: mapHeaders{"x-forwarded-for": "203.0.113.7"}, Lazy: lazy}
	pc.Evaluate(c, &r, &plan)
	pc.Keep(c, &r, &plan, 1)
	for _, tt := range []struct {
		source, xff string
		hit         bool
	}{
		{"192.0.2.9:1", "203.0.113.7", true},
		{"192.0.2.9:2", "203.0.113.7", false},
		{"192.0.2.9:1", "203.0.113.8", false},
	} {
		r := Request{Method: "GET", Path: "/api/x", Source: tt.source, Headers: mapHeaders{"x-forwarded-for": tt.xff}}
		if _, _, ok := pc.Lookup(c, &r); ok != tt.hit {
			t.Errorf("source %s, x-forwarded-for %s: hit %v, want %v", tt.source, tt.xff, ok, tt.hit)
		}
	}
}

// A plan keyed by a peer certificate read its name: another name, or
// none, misses.
func TestPlanCache_LookupPeer(t *testing.T) {
	c := mustConfig(t, `{"identity":{"sources":[{"type":"peer_certificate","san":"dns"}]},
	  "rules":[{"name":"r","match":{"paths":["/api/**"]},"limit":1,"window":"1s"}]}`)
	var pc PlanCache
	var plan Plan
	r := Request{Method: "GET", Path: "/api/x", Headers: mapHeaders{}, Lazy: &countingLazy{dns: "a.shop", uri: "spiffe://a"}}
	pc.Evaluate(c, &r, &plan)
	pc.Keep(c, &r, &plan, 1)
	for _, tt := range []struct {
		dns, uri string
		hit      bool
	}{
		{"a.shop", "spiffe://other", true},
		{"b.shop", "spiffe://a", false},
		{"", "spiffe://a", false},
	} {
		lazy := &countingLazy{dns: tt.dns, uri: tt.uri}
		r := Request{Method: "GET", Path: "/api/x", Source: "192.0.2.9:1", Headers: mapHeaders{}, Lazy: lazy}
		if _, _, ok := pc.Lookup(c, &r); ok != tt.hit || lazy.peer != 1 {
			t.Errorf("dns %q, uri %q: hit %v, want %v (certificate asked for %d times)", tt.dns, tt.uri, ok, tt.hit, lazy.peer)
		}
	}
}

// What the cache does not keep: a plan that read the time (a JWT), an
// exempt plan, one without limits, one Evaluate did not just make.
func TestPlanCache_Keep(t *testing.T) {
	c := mustConfig(t, policyConfig)
	jwt := mustConfig(t, `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"0123456789abcdef0123456789abcdef"}]}]},
	  "rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	tests := []struct {
		name string
		cfg  *Config
		req  Request
		keep func(pc *PlanCache, c *Config, r *Request, p *Plan)
		hit  bool
	}{
		{"kept", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob"}}, nil, true},
		{"read the time", jwt, Request{Method: "GET", Path: "/x", NowUnix: 1_700_000_000, Headers: mapHeaders{"authorization": "Bearer a.b.c"}}, nil, false},
		{"exempt", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "ops"}}, nil, false},
		{"no limits", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "unlimited"}}, nil, false},
		{"after a lookup", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob"}},
			func(pc *PlanCache, c *Config, r *Request, p *Plan) {
				other := Request{Method: "GET", Path: "/y", Headers: mapHeaders{"x-user-id": "eve"}}
				var op Plan
				pc.Evaluate(c, &other, &op)
				pc.Keep(c, &other, &op, 0)
				pc.Lookup(c, &other) // a hit: the reads Evaluate noted are not this request's
				pc.Keep(c, r, p, 0)
			}, false},
		{"under another config", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob"}},
			func(pc *PlanCache, _ *Config, r *Request, p *Plan) { pc.Keep(mustConfig(t, policyConfig), r, p, 0) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pc PlanCache
			var plan Plan
			r := tt.req
			pc.Evaluate(tt.cfg, &r, &plan)
			if tt.keep != nil {
				tt.keep(&pc, tt.cfg, &r, &plan)
			} else {
				pc.Keep(tt.cfg, &r, &plan, 0)
			}
			r = tt.req
			if _, _, ok := pc.Lookup(tt.cfg, &r); ok != tt.hit {
				t.Errorf("hit %v, want %v", ok, tt.hit)
			}
		})
	}
}

// slotMate is another user whose requests to path fall to user's slot.
func slotMate(user, path string) string {
	for i := 0; ; i++ {
		if u := fmt.Sprint("u", i); planHash(Hash(u), path)%planCacheSlots == planHash(Hash(user), path)%planCacheSlots {
			return u
		}
	}
}

// KeepRepeated keeps a plan when the request before it at its slot was
// the same client's on a path alike, and only notes the request otherwise.
func TestPlanCache_KeepRepeated(t *testing.T) {
	c := mustConfig(t, policyConfig)
	jwt := mustConfig(t, `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"0123456789abcdef0123456789abcdef"}]}]},
	  "rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	req := func(user, path string) Request {
		return Request{Method: "GET", Path: path, Headers: mapHeaders{"x-user-id": user}}
	}
	other := slotMate("bob", "/x")
	token := Request{Method: "GET", Path: "/x", NowUnix: 1_700_000_000, Headers: mapHeaders{"authorization": "Bearer a.b.c"}}
	tests := []struct {
		name string
		cfg  *Config
		reqs []Request // offered in turn; the last is looked up
		kept []bool    // what KeepRepeated reports for each
	}{
		{"once", c, []Request{req("bob", "/x")}, []bool{false}},
		{"twice", c, []Request{req("bob", "/x"), req("bob", "/x")}, []bool{false, true}},
		{"another's between", c, []Request{req("bob", "/x"), req(other, "/x"), req("bob", "/x")}, []bool{false, false, false}},
		{"three times, another's between", c, []Request{req("bob", "/x"), req(other, "/x"), req("bob", "/x"), req("bob", "/x")}, []bool{false, false, false, true}},
		{"another slot between", c, []Request{req("bob", "/x"), req("bob", "/yy"), req("bob", "/x")}, []bool{false, false, true}},
		{"a plan that read the time", jwt, []Request{token, token}, []bool{false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pc PlanCache
			var plan Plan
			for i, q := range tt.reqs {
				r := q
				pc.Evaluate(tt.cfg, &r, &plan)
				if got := pc.KeepRepeated(tt.cfg, &r, &plan, 7); got != tt.kept[i] {
					t.Errorf("request %d: kept %v, want %v", i, got, tt.kept[i])
				}
			}
			r := tt.reqs[len(tt.reqs)-1]
			want := tt.kept[len(tt.kept)-1]
			if kept, tag, ok := pc.Lookup(tt.cfg, &r); ok != want || ok && (tag != 7 || !reflect.DeepEqual(planValue(kept), planValue(evaluated(tt.cfg, tt.reqs[len(tt.reqs)-1])))) {
				t.Errorf("lookup: hit %v (tag %d), want %v", ok, tag, want)
			}
		})
	}
}

// A plan identified by a verified JWT is kept, and given while its token
// has not expired (exp plus the leeway); one whose token did not verify,
// expired or not yet valid, is not kept. With the token cache and without.
func TestPlanCache_KeepJWT(t *testing.T) {
	const now = 1_750_000_000
	const secret = "0123456789abcdef0123456789abcdef"
	c := mustConfig(t, `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"`+secret+`"}],"leeway":"5s","require_exp":false}]},
	  "rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	tests := []struct {
		name   string
		claims string
		kept   bool
		until  int64 // the first time its plan is no longer given; 0: never
	}{
		{"exp", fmt.Sprintf(`{"sub":"alice","exp":%d}`, now+60), true, now + 65},
		{"a fractional exp, rounded down", fmt.Sprintf(`{"sub":"alice","exp":%d.9}`, now+60), true, now + 65},
		{"no exp", `{"sub":"alice"}`, true, 0},
		{"expired", fmt.Sprintf(`{"sub":"alice","exp":%d}`, now-10), false, 0},
		{"not yet valid", fmt.Sprintf(`{"sub":"alice","nbf":%d}`, now+100), false, 0},
	}
	for _, tt := range tests {
		for _, tokens := range []*TokenCache{nil, NewTokenCache(4)} {
			t.Run(fmt.Sprintf("%s, token cache %v", tt.name, tokens != nil), func(t *testing.T) {
				req := func(at int64) Request {
					return Request{Method: "GET", Path: "/x", NowUnix: at, Tokens: tokens,
						Headers: mapHeaders{"authorization": "Bearer " + jwttest.HS256(secret, tt.claims)}}
				}
				var pc PlanCache
				var plan Plan
				r := req(now)
				pc.Evaluate(c, &r, &plan)
				pc.Keep(c, &r, &plan, 1)
				for _, at := range []int64{now, now + 64, now + 65, now + 1_000_000} {
					r := req(at)
					kept, _, ok := pc.Lookup(c, &r)
					if want := tt.kept && (tt.until == 0 || at < tt.until); ok != want {
						t.Fatalf("at now+%d: hit %v, want %v", at-now, ok, want)
					}
					if ok && !reflect.DeepEqual(planValue(kept), planValue(evaluated(c, req(at)))) {
						t.Fatalf("at now+%d: kept plan %+v, evaluated %+v", at-now, planValue(kept), planValue(evaluated(c, req(at))))
					}
				}
			})
		}
	}
}

// KeepRepeated notes nothing of a plan Keep would not keep: a client
// whose plans read the time pays no note, request after request.
func TestPlanCache_KeepRepeatedNotesKeepableOnly(t *testing.T) {
	c := mustConfig(t, policyConfig)
	jwt := mustConfig(t, `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"0123456789abcdef0123456789abcdef"}]}]},
	  "rules":[{"name":"r","limit":1,"window":"1s"}]}`)
	for _, tt := range []struct {
		name string
		cfg  *Config
		req  Request
	}{
		{"read the time", jwt, Request{Method: "GET", Path: "/x", NowUnix: 1_700_000_000, Headers: mapHeaders{"authorization": "Bearer a.b.c"}}},
		{"exempt", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "ops"}}},
		{"no limits", c, Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "unlimited"}}},
	} {
		var pc PlanCache
		var plan Plan
		r := tt.req
		pc.Evaluate(tt.cfg, &r, &plan)
		if pc.KeepRepeated(tt.cfg, &r, &plan, 1) || pc.seen != [planCacheSlots]uint64{} {
			t.Errorf("%s: noted or kept", tt.name)
		}
	}
}

// Retag changes the tag of the plan the last Lookup answered or the last
// Keep kept, and of no plan once anything else came between.
func TestPlanCache_Retag(t *testing.T) {
	c := mustConfig(t, policyConfig)
	bob := Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob"}}
	eve := Request{Method: "GET", Path: "/y", Headers: mapHeaders{"x-user-id": "eve"}}
	var plan Plan
	tests := []struct {
		name    string
		between func(pc *PlanCache)
		want    uint64 // bob's tag after Retag(2)
	}{
		{"after Keep", func(*PlanCache) {}, 2},
		{"after a hit", func(pc *PlanCache) { r := bob; pc.Lookup(c, &r) }, 2},
		{"after a miss", func(pc *PlanCache) { r := eve; pc.Lookup(c, &r) }, 1},
		{"after Evaluate", func(pc *PlanCache) { r := eve; pc.Evaluate(c, &r, &plan) }, 1},
		{"after a Keep that kept nothing", func(pc *PlanCache) { r := bob; pc.Keep(c, &r, &plan, 3) }, 1},
		{"after another's Keep", func(pc *PlanCache) { r := eve; pc.Evaluate(c, &r, &plan); pc.Keep(c, &r, &plan, 3) }, 1},
		{"after Reset", func(pc *PlanCache) { pc.Reset() }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pc PlanCache
			r := bob
			pc.Evaluate(c, &r, &plan)
			pc.Keep(c, &r, &plan, 1)
			tt.between(&pc)
			pc.Retag(2)
			r = bob
			if _, tag, _ := pc.Lookup(c, &r); tag != tt.want {
				t.Errorf("tag %d, want %d", tag, tt.want)
			}
		})
	}
}

// Sweep forgets the kept plans once a sweep period passes without a hit.
func TestPlanCache_Sweep(t *testing.T) {
	pc, lookup := keptBob(t)
	if !lookup() {
		t.Fatal("not kept")
	}
	pc.Sweep() // a hit since the last sweep: kept
	if !lookup() {
		t.Fatal("forgotten after a period with a hit")
	}
	pc.Sweep()
	pc.Sweep() // a period without one: forgotten
	if lookup() {
		t.Fatal("kept after a period without a hit")
	}
}

// A plan from the cache is the plan Evaluate makes, whatever the requests
// before: requests drawn from a few values of each input, kept or not, at
// times that go on (some clients identified by JWTs that expire).
func FuzzPlanCache(f *testing.F) {
	const t0, secret = 1_750_000_000, "0123456789abcdef0123456789abcdef"
	tokens := []string{"", "Bearer " + jwttest.HS256(secret, fmt.Sprintf(`{"sub":"a","exp":%d}`, t0+10)),
		"Bearer " + jwttest.HS256(secret, fmt.Sprintf(`{"sub":"a","exp":%d}`, t0+20)), "Bearer " + jwttest.HS256(secret, `{"sub":"b"}`),
		"Bearer " + jwttest.HS256(secret, fmt.Sprintf(`{"sub":"b","nbf":%d,"exp":%d}`, t0+8, t0+30)),
		"Bearer " + jwttest.HS256("another secret, 32 bytes or more.", `{"sub":"a"}`)}
	jwt := mustConfig(f, `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"`+secret+`"}],"leeway":"5s","require_exp":false}]},
	  "rules":[{"name":"u","scope":"user","limit":1,"window":"1s"},{"name":"e","match":{"paths":["/api/**"]},"scope":"user+endpoint","limit":1,"window":"1s"}]}`)
	configs := []*Config{mustConfig(f, policyConfig), mustConfig(f, `{"identity":{"client_ip":{"trusted_proxy_depth":1}},
	  "rules":[{"name":"r","match":{"paths":["/api/**"]},"scope":"ip","limit":1,"window":"1s"},
	           {"name":"h","match":{"headers":[{"name":"x-tier","equals":"free"}]},"scope":"ip+endpoint","limit":1,"window":"1s"},
	           {"name":"q","match":{"query":[{"name":"format","suffix":"csv"}]},"scope":"ip","limit":1,"window":"1s"},
	           {"name":"o","match":{"paths":["/api/x"]},"scope":"ip","limit":1,"window":"1s","on_response":{"statuses":[401]}}]}`),
		mustConfig(f, `{"identity":{"sources":[{"type":"query","param":"user"},{"type":"header","header":"x-user-id"}],"api_key_query":"key"},
	  "rules":[{"name":"u","scope":"user+endpoint","limit":1,"window":"1s"},{"name":"k","scope":"api_key","limit":1,"window":"1s"}]}`)}
	f.Add([]byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09"))
	f.Add([]byte("\xff\x13\x37\x42\x99\x00\x00\x00\x00\x00\xff\x13\x37\x42\x99\x00\x00\x00\x00\x01"))
	pick := func(b byte, vals ...string) string { return vals[int(b)%len(vals)] }
	f.Fuzz(func(t *testing.T, data []byte) {
		var pc PlanCache
		var plan Plan
		cache := NewTokenCache(2)
		now := int64(t0)
		for len(data) >= 10 {
			d := data[:10]
			data = data[10:]
			c := configs[d[0]&1]
			if d[0]&0x80 != 0 {
				c = configs[2]
			}
			if d[0]&0x40 != 0 {
				c = jwt
			}
			now += []int64{0, 1, 4, 5, 10}[int(d[1]>>1)%5]
			h := mapHeaders{}
			for i, name := range []string{"x-user-id", "x-tenant", "x-tier", "x-api-key", "x-forwarded-for", "x-canary"} {
				if v := pick(d[3+i], "", "a", "b", "ops", "premium", "free", "unlimited", "203.0.113.7", "10.1.2.3"); v != "" {
					h[name] = v
				}
			}
			if v := tokens[int(d[0]>>2&7)%len(tokens)]; v != "" {
				h["authorization"] = v
			}
			req := Request{Method: pick(d[1], "GET", "POST"), Path: pick(d[2], "/api/v1/chat/x", "/api/v1/request", "/x", "/api/v1/login?y",
				"/api/x?format=csv", "/api/x?format=c%73v&format=json", "/api/x?format=tsv",
				"/api/x?user=a&key=k", "/api/x?user=%61&key=%6b", "/api/x?user=b&key=k", "/api/x?key=+&user=a+"),
				Host: pick(d[9], "api.example.com", "a.beta.example.com"), Source: pick(d[9]>>1, "192.0.2.9:1", "10.0.0.1:2"), Headers: h,
				NowUnix: now}
			if d[9]&4 != 0 {
				req.Tokens = cache
			}
			want := planValue(evaluated(c, req))
			r := req
			if kept, _, ok := pc.Lookup(c, &r); ok {
				if got := planValue(kept); !reflect.DeepEqual(got, want) {
					t.Fatalf("%+v: kept plan %+v, want %+v", req, got, want)
				}
				continue
			}
			pc.Evaluate(c, &r, &plan)
			if got := planValue(&plan); !reflect.DeepEqual(got, want) {
				t.Fatalf("%+v: evaluated through the cache %+v, want %+v", req, got, want)
			}
			if d[0]&2 == 0 {
				pc.Keep(c, &r, &plan, 0)
			}
		}
	})
}

func TestPlanCache_Reset(t *testing.T) {
	pc, lookup := keptBob(t)
	pc.Reset()
	if lookup() {
		t.Fatal("kept after Reset")
	}
}

// keptBob is a plan cache that keeps the plan of a request by bob, and a
// lookup of that request.
func keptBob(t *testing.T) (*PlanCache, func() bool) {
	c := mustConfig(t, policyConfig)
	pc := &PlanCache{}
	var plan Plan
	req := Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": "bob"}}
	r := req
	pc.Evaluate(c, &r, &plan)
	pc.Keep(c, &r, &plan, 0)
	return pc, func() bool { r := req; _, _, ok := pc.Lookup(c, &r); return ok }
}

// Keeping a plan allocates nothing once the entry's buffers have grown: a
// proxy under attack by many clients keeps plans over and over.
func TestPlanCache_KeepAllocates(t *testing.T) {
	c := mustConfig(t, policyConfig)
	var pc PlanCache
	var plan Plan
	var headers []HeaderSource
	for _, u := range []string{"bob", "carol", "dave"} {
		headers = append(headers, mapHeaders{"x-user-id": u, "x-tenant": "acme"})
	}
	keep := func(i int) {
		r := Request{Method: "POST", Path: "/api/v1/chat/send", Source: "192.0.2.9:1", Headers: headers[i%len(headers)]}
		pc.Evaluate(c, &r, &plan)
		pc.Keep(c, &r, &plan, 0)
	}
	for i := range 2 * len(headers) {
		keep(i)
	}
	i := 0
	if n := testing.AllocsPerRun(100, func() { keep(i); i++ }); n != 0 {
		t.Errorf("%.1f allocations per plan evaluated and kept", n)
	}
}

// A proxy's clients interleave: 100 of them in turn, each coming back
// after the 99 others, mostly find their plans kept from their last
// round, as those of a few hundred do.
func TestPlanCache_InterleavedClients(t *testing.T) {
	c := mustConfig(t, policyConfig)
	var pc PlanCache
	var plan Plan
	hits := 0
	for round := range 3 {
		hits = 0
		for i := range 100 {
			r := Request{Method: "GET", Path: "/api/v1/items", Headers: mapHeaders{"x-user-id": fmt.Sprint("client-", i)}}
			if kept, _, ok := pc.Lookup(c, &r); ok {
				if !reflect.DeepEqual(planValue(kept), planValue(evaluated(c, r))) {
					t.Fatalf("round %d, client %d: kept %+v, want %+v", round, i, planValue(kept), planValue(evaluated(c, r)))
				}
				hits++
				continue
			}
			pc.Evaluate(c, &r, &plan)
			pc.KeepRepeated(c, &r, &plan, 1)
		}
	}
	if hits < 60 {
		t.Errorf("%d of 100 clients found their plans kept in the third round, want most", hits)
	}
}

// AppendKeptCheck writes what AppendCheckRequest does, for the plan the
// last Lookup answered or the last Keep kept, and declines a check that
// would differ from that plan's.
func TestPlanCache_AppendKeptCheck(t *testing.T) {
	c := mustConfig(t, policyConfig)
	req := func(user string) Request {
		return Request{Method: "GET", Path: "/x", Headers: mapHeaders{"x-user-id": user}}
	}
	other := slotMate("bob", "/x")
	keep := func(pc *PlanCache, user string) *Plan {
		var plan Plan
		r := req(user)
		pc.Evaluate(c, &r, &plan)
		pc.Keep(c, &r, &plan, 1)
		return &plan
	}
	keepBob := func(pc *PlanCache) *Plan { return keep(pc, "bob") }
	lookup := func(pc *PlanCache, user string) *Plan {
		r := req(user)
		kept, _, ok := pc.Lookup(c, &r)
		if !ok {
			t.Fatalf("%s: no plan kept", user)
		}
		var plan Plan
		plan.CopyFrom(kept)
		return &plan
	}
	tests := []struct {
		name   string
		setup  func(pc *PlanCache) *Plan // the plan whose check is asked for
		change func(p *Plan)
		ok     bool
	}{
		{"after a keep", keepBob, nil, true},
		{"after a lookup", func(pc *PlanCache) *Plan { keep(pc, "bob"); return lookup(pc, "bob") }, nil, true},
		{"rendered, then another plan kept in its slot", func(pc *PlanCache) *Plan {
			p := keep(pc, "bob")
			if _, ok := pc.AppendKeptCheck(nil, "r", p.Identity.User, p.Endpoint, p.Limits); !ok {
				t.Fatal("bob's check declined")
			}
			keep(pc, other)
			return lookup(pc, other)
		}, nil, true},
		{"nothing kept", func(pc *PlanCache) *Plan { return evaluated(c, req("bob")) }, nil, false},
		{"an evaluation since", func(pc *PlanCache) *Plan {
			keep(pc, "bob")
			var p Plan
			r := req("bob")
			pc.Evaluate(c, &r, &p)
			return &p
		}, nil, false},
		{"another user", keepBob, func(p *Plan) { p.Identity.User = "carol" }, false},
		{"another endpoint", keepBob, func(p *Plan) { p.Endpoint = "/y" }, false},
		{"another key", keepBob, func(p *Plan) { p.Limits[0].Key = []byte("k") }, false},
		{"a lease asked for", keepBob, func(p *Plan) { p.Limits[0].AskLease = true }, false},
		{"a lease handed back", keepBob, func(p *Plan) { p.Limits[0].Return.Units = 3 }, false},
		{"another throttle delay", keepBob, func(p *Plan) { p.Limits[0].MaxDelayMS++ }, false},
		{"a limit fewer", keepBob, func(p *Plan) { p.Limits = p.Limits[:0] }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var pc PlanCache
			p := tt.setup(&pc)
			if len(p.Limits) == 0 {
				t.Fatal("a plan without limits")
			}
			p.Limits = append([]PlannedLimit(nil), p.Limits...)
			if tt.change != nil {
				tt.change(p)
			}
			for _, rid := range []string{"req-1", "", "bad\xffid", strings.Repeat("r", MaxRequestIDLen+1)} {
				prefix := []byte("x")
				got, ok := pc.AppendKeptCheck(prefix, rid, p.Identity.User, p.Endpoint, p.Limits)
				if ok != tt.ok {
					t.Fatalf("ok %v, want %v", ok, tt.ok)
				}
				want := []byte("x")
				if ok {
					want = AppendCheckRequest(want, rid, p.Identity.User, p.Endpoint, p.Limits)
				}
				if string(got) != string(want) {
					t.Errorf("request id %q:\n got %s\nwant %s", rid, got, want)
				}
			}
		})
	}
}

// A proxy VM's plan cache: a client's first request is evaluated and
// noted, its second evaluated and kept, and its next ones get the kept
// plan, and the plan's check from its kept rendering, without evaluating.
func ExamplePlanCache() {
	c, err := ParseConfig([]byte(`{"identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 100, "window": "1m", "algorithm": "fixed_window"}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	var pc PlanCache
	var plan Plan
	for i := 1; i <= 3; i++ {
		r := Request{Method: "GET", Path: "/api/items", Headers: mapHeaders{"x-user-id": "alice"}}
		if kept, _, ok := pc.Lookup(c, &r); ok {
			plan.CopyFrom(kept)
			fmt.Printf("request %d: the kept plan\n", i)
		} else {
			pc.Evaluate(c, &r, &plan)
			fmt.Printf("request %d: evaluated, kept %v\n", i, pc.KeepRepeated(c, &r, &plan, 0))
		}
		check, ok := pc.AppendKeptCheck(nil, fmt.Sprint("req-", i), plan.Identity.User, plan.Endpoint, plan.Limits)
		if !ok {
			check = AppendCheckRequest(nil, fmt.Sprint("req-", i), plan.Identity.User, plan.Endpoint, plan.Limits)
		}
		fmt.Printf("  check from the kept plan %v: %s\n", ok, check)
	}
	// Output:
	// request 1: evaluated, kept false
	//   check from the kept plan false: {"request_id":"req-1","user":"alice","endpoint":"/api/items","limits":[{"key":"rl:{u:alice}:api","rule":"api","algorithm":"fixed_window","limit":100,"window_ms":60000,"burst":100,"cost":1,"per_user":true}]}
	// request 2: evaluated, kept true
	//   check from the kept plan true: {"request_id":"req-2","user":"alice","endpoint":"/api/items","limits":[{"key":"rl:{u:alice}:api","rule":"api","algorithm":"fixed_window","limit":100,"window_ms":60000,"burst":100,"cost":1,"per_user":true}]}
	// request 3: the kept plan
	//   check from the kept plan true: {"request_id":"req-3","user":"alice","endpoint":"/api/items","limits":[{"key":"rl:{u:alice}:api","rule":"api","algorithm":"fixed_window","limit":100,"window_ms":60000,"burst":100,"cost":1,"per_user":true}]}
}
