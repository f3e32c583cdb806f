package rules

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseConfig_Example(t *testing.T) {
	data, err := os.ReadFile("../examples/config.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatalf("examples/config.json: %v", err)
	}
	if c.FailureMode != FailOpen || c.Bridge.TimeoutMS != 250 || c.Bridge.Path != "/v1/rate-limit/check" {
		t.Errorf("bridge/failure mode: %+v %v", c.Bridge, c.FailureMode)
	}
	if got := len(c.Tiers.List); got != 4 {
		t.Fatalf("tiers: got %d", got)
	}
	prem := c.Tiers.Find("premium")
	if prem == nil || len(prem.Endpoints) != 1 || prem.Endpoints[0].Spec.Limit != 50 || prem.Endpoints[0].Spec.WindowMS != 60_000 {
		t.Errorf("premium override: %+v", prem)
	}
	if prem.Endpoints[0].Spec.Algorithm != SlidingLog {
		t.Errorf("override inherits the tier algorithm, got %v", prem.Endpoints[0].Spec.Algorithm)
	}
	ent := c.Tiers.Find("enterprise")
	if ent.Spec.Burst != 2000 || ent.Spec.Limit != 10000 {
		t.Errorf("enterprise burst: %+v", ent.Spec)
	}
	// The well-known categories' defaults fill in what the configuration leaves out.
	want := map[string]struct {
		limit, window int64
		scope         Scope
	}{"chat": {10, 60_000, Scope(ScopeUser)}, "upload": {2, 600_000, Scope(ScopeUser)}, "auth": {5, 60_000, Scope(ScopeIP)}}
	for _, cat := range c.Categories {
		w := want[cat.Name]
		if cat.Spec.Limit != w.limit || cat.Spec.WindowMS != w.window || cat.Scope != w.scope {
			t.Errorf("category %s: got %d/%dms %v, want %+v", cat.Name, cat.Spec.Limit, cat.Spec.WindowMS, cat.Scope, w)
		}
		if cat.Spec.Penalty == nil || cat.Spec.Penalty.ViolationThreshold != 3 {
			t.Errorf("category %s: top-level penalty not inherited", cat.Name)
		}
	}
	if c.Rules[0].Action != LogOnly {
		t.Errorf("rule action: %v", c.Rules[0].Action)
	}
}

func TestParseConfig_Defaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"rules":[{"name":"r","limit":5,"window":"1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if !c.Enabled || c.FailureMode != FailOpen || c.Bridge.Cluster != "sluice_bridge" || c.Bridge.TimeoutMS != 200 {
		t.Errorf("top-level defaults: %+v", c)
	}
	if r.Spec.Algorithm != SlidingWindow || r.Spec.Burst != 5 || r.Spec.Cost != 1 || r.Scope != Scope(ScopeUser) ||
		r.Action != Reject || r.Priority != 100 || !r.Enabled || r.Spec.Penalty != nil {
		t.Errorf("rule defaults: %+v", r)
	}
	if c.Headers.Prefix != "X-RateLimit-" || !c.Headers.RetryAfter || c.Headers.Strategy || c.Headers.Draft {
		t.Errorf("header defaults: %+v", c.Headers)
	}
	if c.Deny.Status != 429 || c.Deny.FailClosedStatus != 503 || !c.LocalCache.Enabled || c.LocalCache.MaxEntries != 10000 {
		t.Errorf("deny/cache defaults: %+v %+v", c.Deny, c.LocalCache)
	}
	if c.Identity.Anonymous != AnonymousIP {
		t.Errorf("anonymous default: %v", c.Identity.Anonymous)
	}
}

func TestParseConfig_Priority(t *testing.T) {
	c, err := ParseConfig([]byte(`{"rules":[
		{"name":"c","limit":1,"window":"1s"},
		{"name":"a","limit":1,"window":"1s","priority":5},
		{"name":"b","limit":1,"window":"1s","priority":5},
		{"name":"d","limit":1,"window":"1s","priority":-1}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range c.Rules {
		got = append(got, r.Name)
	}
	if strings.Join(got, ",") != "d,a,b,c" {
		t.Errorf("order: %v", got)
	}
}

func TestParseConfig_Errors(t *testing.T) {
	rule := func(extra string) string {
		return `{"rules":[{"name":"ok","limit":1,"window":"1s"},{"name":"r"` + extra + `}]}`
	}
	tests := []struct {
		name, config, path, msg string
	}{
		{"empty", ``, "", "empty"},
		{"not json", `{`, "", "not valid JSON"},
		{"not object", `[]`, "", "must be an object"},
		{"unknown top field", `{"rulez":[]}`, "rulez", "unknown field"},
		{"a field twice", `{"failure_mode":"fail_open","failure_mode":"fail_closed"}`, "failure_mode", "given twice"},
		{"a rule's field twice", rule(`,"limit":1,"window":"1s","limit":5`), "rules[1].limit", "given twice"},
		{"an endpoint override twice", `{"tiers":{"list":[{"name":"free","limit":5,"window":"1m","endpoints":{"/a":2,"/a":3}}]}}`,
			`tiers.list[0].endpoints["/a"]`, "given twice"},
		{"failure mode", `{"failure_mode":"maybe"}`, "failure_mode", "fail_open"},
		{"enabled type", `{"enabled":"yes"}`, "enabled", "true or false"},
		{"limit zero", rule(`,"limit":0,"window":"1s"`), "rules[1].limit", "must be from 1"},
		{"on_response not object", rule(`,"limit":1,"window":"1s","on_response":true`), "rules[1].on_response", "must be an object"},
		{"on_response unknown field", rule(`,"limit":1,"window":"1s","on_response":{"status":[401]}`), "rules[1].on_response.status", "unknown field"},
		{"on_response statuses empty", rule(`,"limit":1,"window":"1s","on_response":{"statuses":[]}`), "rules[1].on_response.statuses", "non-empty array"},
		{"on_response status low", rule(`,"limit":1,"window":"1s","on_response":{"statuses":[401,99]}`), "rules[1].on_response.statuses[1]", "from 100 to 599"},
		{"on_response status class", rule(`,"limit":1,"window":"1s","on_response":{"statuses":["6xx"]}`), "rules[1].on_response.statuses[0]", `"1xx" to "5xx"`},
		{"on_response status text", rule(`,"limit":1,"window":"1s","on_response":{"statuses":["401"]}`), "rules[1].on_response.statuses[0]", "got \"401\""},
		{"on_response cost header empty", rule(`,"limit":1,"window":"1s","on_response":{"cost_header":""}`), "rules[1].on_response.cost_header", "is empty"},
		{"on_response cost header name", rule(`,"limit":1,"window":"1s","on_response":{"cost_header":"x tokens"}`), "rules[1].on_response.cost_header", "not a valid header name"},
		{"cost 0 without on_response", rule(`,"limit":1,"window":"1s","cost":0`), "rules[1].cost", "must be from 1"},
		{"on_response cost both", rule(`,"limit":1,"window":"1s","on_response":{"cost_header":"x-t","cost_body":"usage.total_tokens"}`), "rules[1].on_response.cost_body", "not both"},
		{"on_response cost body empty key", rule(`,"limit":1,"window":"1s","on_response":{"cost_body":"usage..total"}`), "rules[1].on_response.cost_body", "path of object keys"},
		{"on_response cost body index", rule(`,"limit":1,"window":"1s","on_response":{"cost_body":"choices[0].n"}`), "rules[1].on_response.cost_body", "path of object keys"},
		{"on_response cost body deep", rule(`,"limit":1,"window":"1s","on_response":{"cost_body":"a.b.c.d.e.f.g.h.i"}`), "rules[1].on_response.cost_body", "more than 8 keys"},
		{"on_response cost body type", rule(`,"limit":1,"window":"1s","on_response":{"cost_body":5}`), "rules[1].on_response.cost_body", "string"},
		{"months, default algorithm", rule(`,"limit":1,"window":"1mo"`), "rules[1].algorithm", `needs "algorithm": "fixed_window"`},
		{"months, token bucket", rule(`,"limit":1,"window":"1mo","algorithm":"token_bucket"`), "rules[1].algorithm", "is token_bucket"},
		{"months not dividing a year", rule(`,"limit":1,"window":"5mo","algorithm":"fixed_window"`), "rules[1].window", `"6mo" or "12mo"`},
		{"zero months", rule(`,"limit":1,"window":"0mo","algorithm":"fixed_window"`), "rules[1].window", "calendar months are"},
		{"months with a leading zero", rule(`,"limit":1,"window":"01mo","algorithm":"fixed_window"`), "rules[1].window", "calendar months are"},
		{"months and days", rule(`,"limit":1,"window":"1mo1d","algorithm":"fixed_window"`), "rules[1].window", `unit "mo"`},
		{"months leased", rule(`,"limit":10,"window":"1mo","algorithm":"fixed_window","lease":{"size":2}`), "rules[1].lease", "calendar months is never leased"},
		{"months throttled", rule(`,"limit":10,"window":"1mo","algorithm":"fixed_window","action":"throttle"`), "rules[1].window", "a throttle limit needs a window of fixed length"},
		{"months inherited by a sliding override", `{"tiers":{"list":[{"name":"f","limit":500,"window":"1mo","algorithm":"fixed_window","endpoints":{"/a":{"limit":2,"algorithm":"sliding_window"}}}]}}`,
			`tiers.list[0].endpoints["/a"].algorithm`, "is sliding_window"},
		{"on_response throttled", rule(`,"limit":1,"window":"1s","action":"throttle","on_response":{}`), "rules[1].on_response", "not throttled"},
		{"on_response leased", rule(`,"limit":10,"window":"1s","lease":{"size":2},"on_response":{}`), "rules[1].on_response", "not leased"},
		{"on_response in a category", `{"categories":[{"name":"c","paths":["/c"],"limit":1,"window":"1s","on_response":{}}]}`, "categories[0].on_response", "unknown field"},
		{"on_response, an unlimited tier", `{"tiers":{"list":[{"name":"u","unlimited":true,"on_response":{}}]}}`, "tiers.list[0].on_response", "an unlimited tier has no limits"},
		{"on_response, a throttle tier", `{"tiers":{"list":[{"name":"t","limit":5,"window":"1s","action":"throttle","on_response":{}}]}}`, "tiers.list[0].on_response", "not throttled"},
		{"on_response, a leased override", `{"tiers":{"list":[{"name":"t","limit":50,"window":"1s","endpoints":{"/a":{"limit":20,"lease":{"size":2}}},"on_response":{}}]}}`,
			"tiers.list[0].on_response", "not leased"},
		{"limit missing", rule(`,"window":"1s"`), "rules[1].limit", "required"},
		{"limit float", rule(`,"limit":1.5,"window":"1s"`), "rules[1].limit", "integer"},
		{"limit huge", rule(`,"limit":1e30,"window":"1s"`), "rules[1].limit", "integer"},
		{"limit negative", rule(`,"limit":-3,"window":"1s"`), "rules[1].limit", "must be from 1"},
		{"window missing", rule(`,"limit":1`), "rules[1].window", "required"},
		{"window bad unit", rule(`,"limit":1,"window":"1y"`), "rules[1].window", "unit"},
		{"window number", rule(`,"limit":1,"window":60`), "rules[1].window", "duration string"},
		{"window too long", rule(`,"limit":1,"window":"400d"`), "rules[1].window", "must be from"},
		{"algorithm", rule(`,"limit":1,"window":"1s","algorithm":"leaky"`), "rules[1].algorithm", "token_bucket"},
		{"burst not tb", rule(`,"limit":1,"window":"1s","burst":5`), "rules[1].burst", "only for algorithm token_bucket"},
		{"cost over limit", rule(`,"limit":2,"window":"1s","cost":3`), "rules[1].cost", "no request could ever pass"},
		{"scope unknown", rule(`,"limit":1,"window":"1s","scope":"planet"`), "rules[1].scope", "unknown scope"},
		{"scope global combo", rule(`,"limit":1,"window":"1s","scope":"global+ip"`), "rules[1].scope", "cannot be combined"},
		{"scope twice", rule(`,"limit":1,"window":"1s","scope":"ip+ip"`), "rules[1].scope", "twice"},
		{"action", rule(`,"limit":1,"window":"1s","action":"delay"`), "rules[1].action", `must be "reject", "throttle" or "log_only"`},
		{"max_delay without throttle", rule(`,"limit":1,"window":"1s","max_delay":"1s"`), "rules[1].max_delay", `only for action "throttle"`},
		{"max_delay too long", rule(`,"limit":1,"window":"1s","action":"throttle","max_delay":"31s"`), "rules[1].max_delay", "must be from 1ms to 30s"},
		{"max_delay number", rule(`,"limit":1,"window":"1s","action":"throttle","max_delay":5`), "rules[1].max_delay", "duration string"},
		{"throttle sliding window", rule(`,"limit":1,"window":"1s","action":"throttle","algorithm":"sliding_window"`), "rules[1].algorithm", "cannot reserve"},
		{"throttle lease", rule(`,"limit":10,"window":"1s","action":"throttle","lease":{"size":2}`), "rules[1].lease", "throttle limit is never leased"},
		{"throttle category sliding window", `{"categories":[{"name":"chat","paths":["/c"],"action":"throttle","algorithm":"sliding_window"}]}`, "categories[0].algorithm", "cannot reserve"},
		{"throttle tier override", `{"tiers":{"list":[{"name":"t","limit":100,"window":"1s","action":"throttle","endpoints":{"/a":{"limit":20,"algorithm":"sliding_window"}}}]}}`, `tiers.list[0].endpoints["/a"].algorithm`, "cannot reserve"},
		{"tier action", `{"tiers":{"list":[{"name":"t","limit":100,"window":"1s","action":"wait"}]}}`, "tiers.list[0].action", `must be "reject"`},
		{"unlimited tier action", `{"tiers":{"list":[{"name":"u","unlimited":true,"action":"throttle"}]}}`, "tiers.list[0].action", "no limits"},
		{"log_only tier lease", `{"tiers":{"list":[{"name":"t","limit":100,"window":"1s","action":"log_only","lease":{"size":5}}]}}`, "tiers.list[0].lease", "log_only"},
		{"throttle max_waiting", `{"throttle":{"max_waiting":0}}`, "throttle.max_waiting", "must be from 1 to 100000"},
		{"throttle field", `{"throttle":{"max_delay":"1s"}}`, "throttle.max_delay", "unknown field"},
		{"lease size missing", rule(`,"limit":10,"window":"1s","lease":{"ttl":"1s"}`), "rules[1].lease.size", "required"},
		{"lease size over limit", rule(`,"limit":10,"window":"1s","lease":{"size":11}`), "rules[1].lease.size", "more than the limit 10"},
		{"lease size under cost", rule(`,"limit":10,"window":"1s","cost":3,"lease":{"size":2}`), "rules[1].lease.size", "less than the cost 3"},
		{"lease ttl", rule(`,"limit":10,"window":"1s","lease":{"size":2,"ttl":"2m"}`), "rules[1].lease.ttl", "must be from 1ms to 1m"},
		{"lease field", rule(`,"limit":10,"window":"1s","lease":{"size":2,"units":3}`), "rules[1].lease.units", "unknown field"},
		{"lease log_only", rule(`,"limit":10,"window":"1s","action":"log_only","lease":{"size":2}`), "rules[1].lease", "log_only"},
		{"lease penalty", rule(`,"limit":10,"window":"1s","penalty":{"enabled":true},"lease":{"size":2}`), "rules[1].lease", "penalty"},
		{"lease default penalty", `{"penalty":{"enabled":true},"categories":[{"name":"c","paths":["/c"],"limit":10,"window":"1s","lease":{"size":2}}]}`, "categories[0].lease", "penalty"},
		{"lease tier override", `{"tiers":{"list":[{"name":"t","limit":100,"window":"1s","lease":{"size":50},"endpoints":{"/a":20}}]}}`, `tiers.list[0].endpoints["/a"]`, "lease size 50"},
		{"name chars", `{"rules":[{"name":"Bad Name","limit":1,"window":"1s"}]}`, "rules[0].name", "may hold only"},
		{"name missing", `{"rules":[{"limit":1,"window":"1s"}]}`, "rules[0].name", "required"},
		{"name duplicate", `{"rules":[{"name":"a","limit":1,"window":"1s"},{"name":"a","limit":1,"window":"1s"}]}`, "rules[1].name", "already"},
		{"unknown rule field", rule(`,"limt":1`), "rules[1].limt", "unknown field"},
		{"match path", rule(`,"limit":1,"window":"1s","match":{"paths":["api"]}`), "rules[1].match.paths", "api"},
		{"match header both", rule(`,"limit":1,"window":"1s","match":{"headers":[{"name":"x","present":true,"equals":"y"}]}`), "rules[1].match.headers[0]", "not present and equals"},
		{"match header neither", rule(`,"limit":1,"window":"1s","match":{"headers":[{"name":"x"}]}`), "rules[1].match.headers[0]", "needs one of present, equals, prefix, suffix and contains"},
		{"match query not a list", rule(`,"limit":1,"window":"1s","match":{"query":{"name":"x","present":true}}`), "rules[1].match.query", "must be an array"},
		{"match query no name", rule(`,"limit":1,"window":"1s","match":{"query":[{"equals":"csv"}]}`), "rules[1].match.query[0].name", "is required"},
		{"match query long name", rule(`,"limit":1,"window":"1s","match":{"query":[{"name":"` + strings.Repeat("n", 257) + `","present":true}]}`), "rules[1].match.query[0].name", "longer than 256 bytes"},
		{"match query both", rule(`,"limit":1,"window":"1s","match":{"query":[{"name":"x","present":true,"equals":"y"}]}`), "rules[1].match.query[0]", "not present and equals"},
		{"match query field", rule(`,"limit":1,"window":"1s","match":{"query":[{"name":"x","regex":"y"}]}`), "rules[1].match.query[0].regex", "unknown field"},
		{"match header two ops", rule(`,"limit":1,"window":"1s","match":{"headers":[{"name":"x","prefix":"a","suffix":"b"}]}`), "rules[1].match.headers[0]", "not prefix and suffix"},
		{"match header empty prefix", rule(`,"limit":1,"window":"1s","match":{"headers":[{"name":"x","prefix":""}]}`), "rules[1].match.headers[0].prefix", "is empty"},
		{"match query empty contains", rule(`,"limit":1,"window":"1s","match":{"query":[{"name":"x","contains":""}]}`), "rules[1].match.query[0].contains", "is empty"},
		{"penalty multipliers shrink", rule(`,"limit":1,"window":"1s","penalty":{"multipliers":[4,2]}`), "rules[1].penalty.multipliers[1]", "only lengthen"},
		{"penalty threshold", `{"penalty":{"violation_threshold":0}}`, "penalty.violation_threshold", "must be from 1"},
		{"category no paths", `{"categories":[{"name":"chat"}]}`, "categories[0].paths", "at least one"},
		{"category custom needs limit", `{"categories":[{"name":"misc","paths":["/x"]}]}`, "categories[0].limit", "required"},
		{"category clashes rule", `{"rules":[{"name":"chat","limit":1,"window":"1s"}],"categories":[{"name":"chat","paths":["/c"]}]}`, "categories[0].name", "already"},
		{"tiers empty", `{"tiers":{"list":[]}}`, "tiers.list", "non-empty"},
		{"tier default unknown", `{"tiers":{"default":"gold","list":[{"name":"free","limit":1,"window":"1m"}]}}`, "tiers.default", "not one of"},
		{"tier unlimited with limit", `{"tiers":{"list":[{"name":"u","unlimited":true,"limit":5}]}}`, "tiers.list[0].limit", "no limits"},
		{"tier override bad path", `{"tiers":{"list":[{"name":"f","limit":5,"window":"1m","endpoints":{"nope":1}}]}}`, `tiers.list[0].endpoints["nope"]`, "/"},
		{"tier override zero", `{"tiers":{"list":[{"name":"f","limit":5,"window":"1m","endpoints":{"/a":0}}]}}`, `tiers.list[0].endpoints["/a"]`, "must be from 1"},
		{"tier override looser", `{"tiers":{"list":[{"name":"f","limit":20,"window":"1m","endpoints":{"/x":500}}]}}`, `tiers.list[0].endpoints["/x"]`, "looser than the tier"},
		{"tier override faster", `{"tiers":{"list":[{"name":"f","limit":20,"window":"1m","endpoints":{"/x":{"limit":10,"window":"1s"}}}]}}`, `tiers.list[0].endpoints["/x"]`, "looser than the tier"},
		{"tier override bigger burst", `{"tiers":{"list":[{"name":"f","limit":20,"window":"1m","endpoints":{"/x":{"limit":50,"window":"1h"}}}]}}`, `tiers.list[0].endpoints["/x"]`, "looser than the tier"},
		{"tier override bucket", `{"tiers":{"list":[{"name":"f","algorithm":"token_bucket","limit":20,"burst":5,"window":"1m","endpoints":{"/x":{"burst":6}}}]}}`, `tiers.list[0].endpoints["/x"]`, "looser than the tier"},
		{"tier override cheaper", `{"tiers":{"list":[{"name":"f","limit":20,"cost":2,"window":"1m","endpoints":{"/x":{"cost":1}}}]}}`, `tiers.list[0].endpoints["/x"]`, "looser than the tier"},
		{"tier claim needs jwt", `{"tiers":{"claim":"plan","list":[{"name":"f","limit":5,"window":"1m"}]}}`, "tiers.claim", "jwt"},
		{"jwt without keys", `{"identity":{"sources":[{"type":"jwt"}]}}`, "identity.sources[0].keys", "at least one"},
		{"query source without param", `{"identity":{"sources":[{"type":"query"}]}}`, "identity.sources[0].param", "is required for type query"},
		{"query source with header", `{"identity":{"sources":[{"type":"query","param":"u","header":"x"}]}}`, "identity.sources[0].header", "not for type query"},
		{"query source long param", `{"identity":{"sources":[{"type":"query","param":"` + strings.Repeat("p", 257) + `"}]}}`, "identity.sources[0].param", "longer than 256 bytes"},
		{"param on a header source", `{"identity":{"sources":[{"type":"header","header":"x","param":"u"}]}}`, "identity.sources[0].param", "only for types query and jwt"},
		{"jwt with header and param", `{"identity":{"sources":[{"type":"jwt","header":"x","param":"t","keys":[{"alg":"HS256","secret":"0123456789abcdef0123456789abcdef"}]}]}}`, "identity.sources[0].param", "set header or param, not both"},
		{"jwt with an empty param", `{"identity":{"sources":[{"type":"jwt","param":"","keys":[{"alg":"HS256","secret":"0123456789abcdef0123456789abcdef"}]}]}}`, "identity.sources[0].param", "must not be empty"},
		{"api_key_query not text", `{"identity":{"api_key_query":1}}`, "identity.api_key_query", "must be a string"},
		{"jwt weak secret", `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"HS256","secret":"short"}]}]}}`, "identity.sources[0].keys[0]", ""},
		{"jwt alg none", `{"identity":{"sources":[{"type":"jwt","keys":[{"alg":"none","secret":"0123456789abcdef0123456789abcdef"}]}]}}`, "identity.sources[0].keys[0]", ""},
		{"source type", `{"identity":{"sources":[{"type":"cookie","header":"x"}]}}`, "identity.sources[0].type", "jwt"},
		{"header source no header", `{"identity":{"sources":[{"type":"header"}]}}`, "identity.sources[0].header", "required"},
		{"header source claim", `{"identity":{"sources":[{"type":"header","header":"x-user","claim":"sub"}]}}`, "identity.sources[0].claim", "only for"},
		{"peer source san", `{"identity":{"sources":[{"type":"peer_certificate","san":"ip"}]}}`, "identity.sources[0].san", `must be "uri" or "dns"`},
		{"peer source header", `{"identity":{"sources":[{"type":"peer_certificate","header":"x-client"}]}}`, "identity.sources[0].header", "not for type peer_certificate"},
		{"san of a header source", `{"identity":{"sources":[{"type":"header","header":"x-user","san":"dns"}]}}`, "identity.sources[0].san", "only for type peer_certificate"},
		{"two peer sources", `{"identity":{"sources":[{"type":"peer_certificate"},{"type":"peer_certificate","san":"dns"}]}}`, "identity.sources[1]", "a second source of type peer_certificate"},
		{"header name", `{"identity":{"api_key_header":"x api"}}`, "identity.api_key_header", "not a valid header name"},
		{"trusted proxy", `{"identity":{"client_ip":{"trusted_proxies":["10.0.0.0/99"]}}}`, "identity.client_ip.trusted_proxies", "10.0.0.0/99"},
		{"depth negative", `{"identity":{"client_ip":{"trusted_proxy_depth":-1}}}`, "identity.client_ip.trusted_proxy_depth", "must be from 0"},
		{"anonymous", `{"identity":{"anonymous":"none"}}`, "identity.anonymous", "shared"},
		{"exempt ip", `{"exemptions":{"ips":["1.2.3"]}}`, "exemptions.ips[0]", "not an IP"},
		{"exempt user empty", `{"exemptions":{"users":[""]}}`, "exemptions.users[0]", "empty"},
		{"bridge timeout", `{"bridge":{"timeout":"2m"}}`, "bridge.timeout", "must be from"},
		{"bridge path", `{"bridge":{"path":"check"}}`, "bridge.path", "start with"},
		{"header prefix", `{"headers":{"prefix":"X Rate"}}`, "headers.prefix", "not a valid"},
		{"deny status", `{"deny":{"status":200}}`, "deny.status", "must be from 400"},
		{"cache entries", `{"local_cache":{"max_entries":0}}`, "local_cache.max_entries", "must be from 1"},
		{"cache hold", `{"local_cache":{"max_hold":"500ms"}}`, "local_cache.max_hold", "must be from 1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.config))
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if c != nil {
				t.Error("a refused config must not be returned half-built")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *ConfigError: %v", err, err)
			}
			if ce.Path != tc.path {
				t.Errorf("path: got %q, want %q (error: %v)", ce.Path, tc.path, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

// A lease is kept per limit: rules, categories and tiers, inherited by a
// tier's endpoint overrides unless they give their own.
func TestParseConfig_Lease(t *testing.T) {
	c, err := ParseConfig([]byte(`{
  "tiers": {"list": [{"name": "t", "limit": 100, "window": "1s", "lease": {"size": 10},
    "endpoints": {"/a": {"limit": 50, "lease": {"size": 5, "ttl": "200ms"}}, "/b": 40}}]},
  "categories": [{"name": "c", "paths": ["/c"], "limit": 10, "window": "1s", "algorithm": "token_bucket", "burst": 20, "lease": {"size": 20}}],
  "rules": [{"name": "r", "limit": 10, "window": "1m", "lease": {"size": 3, "ttl": "30s"}}, {"name": "plain", "limit": 1, "window": "1s"}]
}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		got  Lease
		want Lease
	}{
		{"tier", c.Tiers.List[0].Spec.Lease, Lease{10, DefaultLeaseTTLMS}},
		{"override with its own", c.Tiers.List[0].Endpoints[0].Spec.Lease, Lease{5, 200}},
		{"override inheriting", c.Tiers.List[0].Endpoints[1].Spec.Lease, Lease{10, DefaultLeaseTTLMS}},
		{"category (burst bounds the size)", c.Categories[0].Spec.Lease, Lease{20, DefaultLeaseTTLMS}},
		{"rule", c.Rules[0].Spec.Lease, Lease{3, 30_000}},
		{"no lease", c.Rules[1].Spec.Lease, Lease{}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, tc.got, tc.want)
		}
	}
}

// A rule's on_response: the statuses that charge, as codes and classes,
// and the header holding the cost; absent, the rule is charged before
// its request.
func TestParseConfig_OnResponse(t *testing.T) {
	c, err := ParseConfig([]byte(`{"rules": [
  {"name": "logins", "scope": "ip", "limit": 5, "window": "15m", "on_response": {"statuses": [401, "5xx", 403]}},
  {"name": "tokens", "limit": 100000, "window": "1h", "algorithm": "fixed_window", "action": "log_only",
   "on_response": {"cost_header": "X-Usage-Tokens"}},
  {"name": "plain", "limit": 1, "window": "1s"},
  {"name": "llm", "limit": 100000, "window": "1h", "on_response": {"cost_body": "usageMetadata.total_token-count"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	logins, tokens, plain := c.Rules[0].OnResponse, c.Rules[1].OnResponse, c.Rules[2].OnResponse
	if logins == nil || tokens == nil || plain != nil {
		t.Fatalf("on_response: %+v %+v %+v", logins, tokens, plain)
	}
	for code := 0; code < 700; code++ {
		want := code == 401 || code == 403 || code >= 500 && code <= 599
		if logins.Statuses.Has(code) != want {
			t.Errorf("logins charges status %d: %v, want %v", code, !want, want)
		}
	}
	if logins.CostHeader != "" || !tokens.Statuses.Empty() || tokens.CostHeader != "x-usage-tokens" || tokens.CostBody != nil {
		t.Errorf("logins %+v, tokens %+v", logins, tokens)
	}
	if llm := c.Rules[3].OnResponse; !slices.Equal(llm.CostBody, []string{"usageMetadata", "total_token-count"}) || llm.CostHeader != "" {
		t.Errorf("llm %+v", llm)
	}
}

// A limit charged after the response may cost 0, so that a response that
// does not say what it cost charges nothing; a tier's endpoint overrides
// inherit it.
func TestParseConfig_OnResponseCostZero(t *testing.T) {
	c, err := ParseConfig([]byte(`{
  "tiers": {"list": [{"name": "free", "limit": 50000, "window": "1d", "cost": 0, "on_response": {"cost_body": "usage.total_tokens"},
                      "endpoints": {"/v1/embeddings": 20000, "/v1/images/**": {"limit": 10000}, "/v1/audio/**": {"limit": 5000, "cost": 3}}}]},
  "rules": [{"name": "r", "limit": 100, "window": "1h", "cost": 0, "on_response": {"cost_header": "x-cost"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tier := c.Tiers.List[0]
	got := []int64{c.Rules[0].Spec.Cost, tier.Spec.Cost}
	for _, o := range tier.Endpoints {
		got = append(got, o.Spec.Cost)
	}
	if want := []int64{0, 0, 0, 0, 3}; !slices.Equal(got, want) {
		t.Errorf("costs %v, want %v", got, want)
	}
	if n := (&OnResponse{}).Charge(200, 0, false, c.Rules[0].Spec.Cost); n != 0 {
		t.Errorf("a response that does not say charges %d", n)
	}
}

func TestOnResponse_Charge(t *testing.T) {
	var some StatusSet
	some.Add(401, 401)
	some.Add(500, 599)
	tests := []struct {
		name   string
		o      OnResponse
		status int
		cost   int64
		found  bool
		want   int64
	}{
		{"every status, the limit's cost", OnResponse{}, 200, 0, false, 3},
		{"a status charged", OnResponse{Statuses: some}, 401, 0, false, 3},
		{"a class charged", OnResponse{Statuses: some}, 503, 0, false, 3},
		{"a status not charged", OnResponse{Statuses: some}, 200, 0, false, 0},
		{"no status", OnResponse{Statuses: some}, 0, 0, false, 0},
		{"what the response said", OnResponse{CostHeader: "x-cost"}, 200, 1234, true, 1234},
		{"a cost of 0", OnResponse{CostHeader: "x-cost"}, 200, 0, true, 0},
		{"not said: the limit's cost", OnResponse{CostHeader: "x-cost"}, 200, 0, false, 3},
		{"said, status not charged", OnResponse{Statuses: some, CostHeader: "x-cost"}, 200, 50, true, 0},
	}
	for _, tc := range tests {
		if got := tc.o.Charge(tc.status, tc.cost, tc.found, 3); got != tc.want {
			t.Errorf("%s: Charge(%d, %d, %v) = %d, want %d", tc.name, tc.status, tc.cost, tc.found, got, tc.want)
		}
	}
}

func TestHeaderCost(t *testing.T) {
	tests := []struct {
		v    string
		want int64
		ok   bool
	}{
		{"1234", 1234, true}, {"0", 0, true}, {"007", 7, true},
		{"99999999999999999999999", MaxLimitValue, true},
		{"", 0, false}, {"-5", 0, false}, {" 5", 0, false}, {"1.5", 0, false}, {"5 ", 0, false},
	}
	for _, tc := range tests {
		if got, ok := HeaderCost(tc.v); got != tc.want || ok != tc.ok {
			t.Errorf("HeaderCost(%q) = %d, %v; want %d, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStatusCode(t *testing.T) {
	for s, want := range map[string]int{"200": 200, "429": 429, "599": 599, "": 0, "20": 0, "2000": 0, "2x0": 0, "+20": 0} {
		if got := StatusCode(s); got != want {
			t.Errorf("StatusCode(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestParseDurationMS(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"250ms", 250, true}, {"30s", 30_000, true}, {"1m", 60_000, true}, {"1h", 3600_000, true},
		{"1d", 86400_000, true}, {"1m30s", 90_000, true}, {"0s", 0, true},
		{"", 0, false}, {"1", 0, false}, {"s", 0, false}, {"1.5s", 0, false}, {"-1s", 0, false},
		{"1us", 0, false}, {"99999999999999s", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseDurationMS(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseDurationMS(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
	if FormatDurationMS(60_000) != "1m" || FormatDurationMS(90_000) != "90s" || FormatDurationMS(1500) != "1500ms" {
		t.Error("FormatDurationMS")
	}
}

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in         string
		ms, months int64
		ok         bool
	}{
		{"1h", 3600_000, 0, true}, {"1mo", MonthMS, 1, true}, {"3mo", 3 * MonthMS, 3, true}, {"12mo", MaxWindowMS, 12, true},
		{"2mo", 2 * MonthMS, 2, true}, {"4mo", 4 * MonthMS, 4, true}, {"6mo", 6 * MonthMS, 6, true},
		{"5mo", 0, 0, false}, {"0mo", 0, 0, false}, {"24mo", 0, 0, false}, {"mo", 0, 0, false}, {"012mo", 0, 0, false},
		{"1.5mo", 0, 0, false}, {"-1mo", 0, 0, false}, {"1mo1d", 0, 0, false}, {"999999999999999999mo", 0, 0, false},
	}
	for _, tc := range tests {
		ms, months, err := ParseWindow(tc.in)
		if (err == nil) != tc.ok || ms != tc.ms || months != tc.months {
			t.Errorf("ParseWindow(%q) = %d, %d, %v; want %d, %d, ok=%v", tc.in, ms, months, err, tc.ms, tc.months, tc.ok)
		}
	}
}

// A tier of calendar months: its endpoint overrides inherit the months
// unless they give a window of their own, and the 429 body speaks of it.
func TestParseConfig_CalendarMonths(t *testing.T) {
	c, err := ParseConfig([]byte(`{"tiers": {"list": [{"name": "pro", "limit": 100000, "window": "1mo", "algorithm": "fixed_window",
  "endpoints": {"/export": {"limit": 50}, "/burst": {"limit": 2, "window": "1h"}}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	tier := c.Tiers.List[0]
	if tier.Spec.Months != 1 || tier.Spec.WindowMS != MonthMS {
		t.Errorf("tier: %+v", tier.Spec)
	}
	for _, e := range tier.Endpoints {
		want := int64(1)
		if e.Match.Raw == "/burst" {
			want = 0
		}
		if e.Spec.Months != want {
			t.Errorf("%s: months %d, want %d (%+v)", e.Match.Raw, e.Spec.Months, want, e.Spec)
		}
	}
	l := PlannedLimit{Rule: "tier.pro", Spec: &tier.Spec}
	body := string(c.AppendDenyBodyStart(nil, &l, &Decision{Limit: 100000, ResetMS: 1_800_000_000_000}, 1_799_000_000_000))
	if !strings.Contains(body, "100000 requests per 1mo allowed") {
		t.Errorf("429 body: %s", body)
	}
}

func FuzzParseConfig(f *testing.F) {
	if data, err := os.ReadFile("../examples/config.json"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{"rules":[{"name":"r","limit":5,"window":"1s","match":{"paths":["/a/**"]}}]}`))
	f.Add([]byte(`{"tiers":{"list":[{"name":"f","limit":5,"window":"1m","endpoints":{"/a":{"limit":2}}}]}}`))
	f.Add([]byte(`{"identity":{"client_ip":{"trusted_proxies":["10.0.0.0/8"]}},"exemptions":{"ips":["::1"]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a ConfigError: %v", err)
			}
			return
		}
		// Whatever is accepted must be usable per request without panicking.
		var plan Plan
		c.Evaluate(&Request{Method: "GET", Path: "/a/b?q", Host: "h", Source: "1.2.3.4:5", Headers: mapHeaders{}}, &plan)
		for _, l := range plan.Limits {
			if l.Spec.Limit <= 0 || l.Spec.WindowMS <= 0 || l.Spec.Cost <= 0 || l.Spec.Burst <= 0 {
				t.Fatalf("accepted an unusable limit %+v", *l.Spec)
			}
		}
	})
}

// An endpoint override may only tighten its tier: the most restrictive
// limit wins. Compared in requests, so as many at once (the capacity) and
// as many over time (the rate), whatever the window.
func TestParseConfig_EndpointOverrideTightens(t *testing.T) {
	for _, endpoints := range []string{
		`{"/x": 20}`,
		`{"/x": 5}`,
		`{"/x": {"limit": 10, "window": "30s"}}`, // same rate, half the capacity
		`{"/x": {"limit": 20, "window": "1h"}}`,  // same capacity, slower
		`{"/x": {"limit": 30, "cost": 2}}`,       // 15 requests per minute
		`{"/x": {"algorithm": "token_bucket"}}`,  // same numbers, another algorithm
	} {
		cfg := `{"tiers":{"list":[{"name":"f","limit":20,"window":"1m","endpoints":` + endpoints + `}]}}`
		if _, err := ParseConfig([]byte(cfg)); err != nil {
			t.Errorf("%s: %v", endpoints, err)
		}
	}
}

// TestParseConfig_Throttle: what a throttle limit reads as on rules,
// categories and tiers, and the limits a request's plan carries.
func TestParseConfig_Throttle(t *testing.T) {
	c, err := ParseConfig([]byte(`{
	  "throttle": {"max_waiting": 200},
	  "rules": [
	    {"name": "hooks", "match": {"paths": ["/hooks"]}, "limit": 50, "window": "1s", "action": "throttle", "max_delay": "5s"},
	    {"name": "batch", "match": {"paths": ["/batch"]}, "limit": 10, "window": "1s", "burst": 2, "action": "throttle"},
	    {"name": "logs", "match": {"paths": ["/logs"]}, "limit": 10, "window": "1m", "algorithm": "sliding_log", "action": "throttle", "max_delay": "250ms"}
	  ],
	  "categories": [{"name": "upload", "paths": ["/up"], "action": "throttle"}],
	  "tiers": {"list": [{"name": "free", "limit": 100, "window": "1m", "algorithm": "fixed_window", "action": "throttle", "max_delay": "2s",
	    "endpoints": {"/slow": 10, "/log": {"limit": 5, "algorithm": "sliding_log"}}}]}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Throttle.MaxWaiting != 200 {
		t.Errorf("max_waiting %d, want 200", c.Throttle.MaxWaiting)
	}
	type want struct {
		alg        Algorithm
		burst      int64
		maxDelayMS int64
	}
	got := func(a Action, s *LimitSpec, maxDelay int64) want {
		if a != Throttle {
			t.Errorf("action %v, want throttle", a)
		}
		return want{s.Algorithm, s.Burst, maxDelay}
	}
	for i, w := range []want{{TokenBucket, 50, 5000}, {TokenBucket, 2, 1000}, {SlidingLog, 10, 250}} {
		r := &c.Rules[i]
		if g := got(r.Action, &r.Spec, r.MaxDelayMS); g != w {
			t.Errorf("rules[%d]: %+v, want %+v", i, g, w)
		}
	}
	// A category's default algorithm (sliding_window) gives way too.
	if g := got(c.Categories[0].Action, &c.Categories[0].Spec, c.Categories[0].MaxDelayMS); g != (want{TokenBucket, 2, 1000}) {
		t.Errorf("category: %+v", g)
	}
	tier := &c.Tiers.List[0]
	if g := got(tier.Action, &tier.Spec, tier.MaxDelayMS); g != (want{FixedWindow, 100, 2000}) {
		t.Errorf("tier: %+v", g)
	}
	if a := tier.Endpoints[1].Spec.Algorithm; a != SlidingLog {
		t.Errorf("tier override algorithm %v", a)
	}

	var plan Plan
	for _, tc := range []struct {
		path     string
		maxDelay []int64
	}{
		{"/hooks", []int64{5000, 2000}},
		{"/slow", []int64{2000}},
		{"/up", []int64{1000, 2000}},
	} {
		c.Evaluate(&Request{Method: "GET", Path: tc.path, Source: "10.0.0.1:1", Headers: mapHeaders{}}, &plan)
		var ds []int64
		for _, l := range plan.Limits {
			if l.Action != Throttle {
				t.Errorf("%s: %s has action %v", tc.path, l.Rule, l.Action)
			}
			ds = append(ds, l.MaxDelayMS)
		}
		if !slices.Equal(ds, tc.maxDelay) {
			t.Errorf("%s: max delays %v, want %v", tc.path, ds, tc.maxDelay)
		}
	}
}

// A configuration, a rule or a policy that is not UTF-8 is refused: a
// pattern or a name with other bytes would not read back as written once
// a store or a proxy encodes it as JSON.
func TestParse_NotUTF8(t *testing.T) {
	bad := []byte("{\"rules\":[{\"name\":\"a\",\"limit\":1,\"window\":\"1s\",\"match\":{\"paths\":[\"/x\xff\"]}}]}")
	if _, err := ParseConfig(bad); err == nil || !strings.Contains(err.Error(), "configuration is not UTF-8") {
		t.Errorf("configuration: %v", err)
	}
	if _, err := ParseRule([]byte("{\"name\":\"a\",\"limit\":1,\"window\":\"1s\",\"match\":{\"paths\":[\"/x\xff\"]}}")); err == nil || !strings.Contains(err.Error(), "rule is not UTF-8") {
		t.Errorf("rule: %v", err)
	}
	c, _ := ParseConfig([]byte(`{}`))
	if _, _, err := c.WithPolicy([]byte("{\"store\":\"s\",\"version\":1,\"rules\":[{\"name\":\"\xff\"}]}")); err == nil || !strings.Contains(err.Error(), "policy is not UTF-8") {
		t.Errorf("policy: %v", err)
	}
}
