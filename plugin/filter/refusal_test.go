package filter

import (
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/rules"
)

// A client refused again in the same second, by the same rendering, is
// answered from the plan cache without evaluating the request (its
// stream's own plan stays empty), and as the evaluated path answers it.
func TestStream_RefusedAgain(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	h.request(p, 2, map[string]string{"x-user-id": "bob"})
	h.answer(p, "200", denyAnswer(h.nowMS))
	refuse := func(user, path string) (fast bool) {
		t.Helper()
		s, _ := h.request(p, 3, map[string]string{"x-user-id": user, ":path": path})
		if h.local == nil || h.local.status != 429 {
			t.Fatalf("%s %s: not refused: %+v", user, path, h.local)
		}
		return len(s.plan.Limits) == 0
	}
	steps := []struct {
		name      string
		user      string
		path      string
		advanceMS int64
		fast      bool
	}{
		{"the first refusal from the cache renders it", "bob", "/api/v1/items", 0, false},
		{"the second is kept as a plan", "bob", "/api/v1/items", 0, false},
		{"then from the plan cache", "bob", "/api/v1/items", 0, true},
		{"and again", "bob", "/api/v1/items", 300, true},
		{"another path evaluates", "bob", "/api/v1/other", 0, false},
		{"the next second reports an event", "bob", "/api/v1/items", 1000, false},
		{"the first after the event is the one the next describes", "bob", "/api/v1/items", 0, false},
		{"after which the cache answers again", "bob", "/api/v1/items", 0, true},
	}
	for _, st := range steps {
		h.nowMS += st.advanceMS
		if fast := refuse(st.user, st.path); fast != st.fast {
			t.Errorf("%s: from the plan cache %v, want %v", st.name, fast, st.fast)
		}
	}
	// Other users are not refused by bob's plan.
	calls := len(h.calls)
	h.request(p, 4, map[string]string{"x-user-id": "carol"})
	if h.local != nil || len(h.calls) != calls+1 {
		t.Errorf("carol: local %+v, call-outs %d→%d", h.local, calls, len(h.calls))
	}
	// A new config: evaluated under it, whatever the cache holds.
	h.config = []byte(`{"bridge": {"cluster": "bridge"}, "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 10, "window": "1m", "action": "log_only"}]}`)
	if !p.OnPluginStart(len(h.config)) {
		t.Fatal("config refused")
	}
	h.request(p, 5, map[string]string{"x-user-id": "bob"})
	if h.local != nil {
		t.Errorf("refused under a config that only logs: %+v", h.local)
	}
}

// A client's plan is kept once two of its requests in a row fall to their
// slot, so that the next is not evaluated again: tagged as no refusal while
// its requests go on, as its refusal once one is refused from the
// over-limit cache. A refused request's plan is kept at once.
func TestStream_PlanKept(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	tests := []struct {
		name    string
		headers map[string]string
		answer  func(now int64) string // the bridge's, when it is asked
		kept    bool
		refusal bool // kept with a refusal's tag
	}{
		{"a client's first request", map[string]string{"x-user-id": "bob"}, allowAnswer, false, false},
		{"its second", map[string]string{"x-user-id": "bob"}, allowAnswer, true, false},
		{"its third, from the cache", map[string]string{"x-user-id": "bob"}, allowAnswer, true, false},
		{"exempt", map[string]string{"x-user-id": "ops"}, nil, false, false},
		{"exempt again", map[string]string{"x-user-id": "ops"}, nil, false, false},
		{"no limit applies", map[string]string{"x-user-id": "dave", ":path": "/health"}, nil, false, false},
		{"no limit applies again", map[string]string{"x-user-id": "dave", ":path": "/health"}, nil, false, false},
		{"refused by the bridge", map[string]string{"x-user-id": "carol"}, denyAnswer, false, false},
		{"then from the over-limit cache", map[string]string{"x-user-id": "carol"}, nil, true, true},
		{"a kept client refused by the bridge", map[string]string{"x-user-id": "bob"}, denyAnswer, true, false},
		{"then from the over-limit cache, its plan retagged", map[string]string{"x-user-id": "bob"}, nil, true, true},
	}
	var bodies []string
	for i, tt := range tests {
		calls := len(h.calls)
		s, _ := h.request(p, uint32(i+2), tt.headers)
		if asked := len(h.calls) > calls; asked != (tt.answer != nil) {
			t.Fatalf("%s: asked the bridge %v", tt.name, asked)
		}
		if tt.answer != nil {
			bodies = append(bodies, h.calls[len(h.calls)-1].body)
			h.answer(p, "200", tt.answer(h.nowMS))
		}
		r := rules.Request{Method: h.reqHeaders[":method"], Path: h.reqHeaders[":path"], Host: h.reqHeaders[":authority"], Headers: fakeHeaders{h}}
		_, tag, ok := p.plans.Lookup(s.cfg, &r)
		if ok != tt.kept || ok && (tag != noRefusal) != tt.refusal {
			t.Errorf("%s: kept %v with tag %#x, want kept %v, a refusal's tag %v", tt.name, ok, tag, tt.kept, tt.refusal)
		}
	}
	if bodies[0] != bodies[2] {
		t.Errorf("the kept plan asks another check:\n%s\n%s", bodies[0], bodies[2])
	}
}

// A JWT client's kept plan serves its refusals until the token expires;
// after that its request is evaluated, anonymous, and not refused as it.
func TestStream_JWTPlanExpires(t *testing.T) {
	const secret = "0123456789abcdef0123456789abcdef"
	h, p := startPlugin(t, `{"failure_mode": "fail_open", "bridge": {"cluster": "bridge"},
	  "identity": {"sources": [{"type": "jwt", "keys": [{"alg": "HS256", "secret": "`+secret+`"}], "leeway": "0s"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 10, "window": "1m"}]}`)
	bob := map[string]string{"authorization": "Bearer " + jwttest.HS256(secret, fmt.Sprintf(`{"sub":"bob","exp":%d}`, h.nowMS/1000+10))}
	h.request(p, 2, bob)
	h.answer(p, "200", string(rules.AppendCheckResponse(nil, &rules.CheckResponse{NowMS: h.nowMS, Decisions: []rules.Decision{
		{Limit: 10, ResetMS: h.nowMS + 60_000, RetryAfterMS: 60_000}}})))
	for i, fast := range []bool{false, false, true, true} {
		s, _ := h.request(p, uint32(3+i), bob)
		if h.local == nil || h.local.status != 429 || (len(s.plan.Limits) == 0) != fast {
			t.Fatalf("refusal %d: %+v, from the plan cache %v, want %v", i, h.local, len(s.plan.Limits) == 0, fast)
		}
	}
	h.nowMS += 10_000 // the token's exp
	calls := len(h.calls)
	h.request(p, 7, bob)
	if h.local != nil || len(h.calls) != calls+1 || strings.Contains(h.calls[calls].body, "u:bob") {
		t.Fatalf("after exp: local %+v, call-outs %d→%d", h.local, calls, len(h.calls))
	}
}

// The plan cache and looking at the path first change nothing a host
// sees: two proxies given the same requests, answers, clock and ticks, one
// of them with its plan cache emptied before every request and the path
// never looked at first, the other with the path always looked at first,
// answer, log, count, call out and share alike.
func FuzzStream_PlanCache(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05\x05\x00\x00\x00\x00\x06\x0b\x00\x00\x00\x00\x07\x00\x00\x00\x01\x00"))
	f.Add([]byte("\x00\x04\x01\x00\x04\x01\x01\x01\x00\x00\x00\x02\x05\xff\x00\x00\x04\x01\x06\x33\x00\x00\x04\x01\x00\x02\x02"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, pa := startPlugin(t, fuzzPlanConfig)
		b, pb := startPlugin(t, fuzzPlanConfig)
		users := []string{"bob", "carol", "ops"}
		paths := []string{"/api/v1/items", "/api/v1/other", "/health"}
		methods := []string{"GET", "POST", "PUT"}
		hosts := []string{"api.example.com", "a.example.com", "b.example.org"}
		for step := 0; len(data) >= 3; step++ {
			op, x, y := data[0], data[1], data[2]
			data = data[3:]
			for _, hp := range []struct {
				h *fakeHost
				p *Plugin
			}{{a, pa}, {b, pb}} {
				h, p := hp.h, hp.p
				switch op % 8 {
				case 5:
					h.nowMS += int64(x) * 10
				case 6:
					h.nowMS += int64(x) * 100
				case 7:
					h.tick(p)
				default:
					if p == pb {
						p.plans.Sweep()
						p.plans.Sweep() // two periods without a hit: forgotten
						p.unmatched = 0
					} else {
						p.unmatched = shareOne
					}
					calls := len(h.calls)
					h.request(p, uint32(step+2), map[string]string{"x-user-id": users[int(x)%len(users)],
						":path": paths[int(y)%len(paths)], ":method": methods[int(x>>5)%len(methods)],
						":authority": hosts[int(y>>5)%len(hosts)], "x-request-id": fmt.Sprint("r", step)})
					if len(h.calls) > calls {
						req, err := rules.DecodeCheckRequest([]byte(h.calls[len(h.calls)-1].body))
						if err != nil {
							t.Fatal(err)
						}
						h.answer(p, "200", answer(h.nowMS, len(req.Limits), x>>2, int64(y%5+1)*700))
					}
				}
			}
			for _, c := range []struct {
				what string
				a, b any
			}{
				{"local response", a.local, b.local}, {"call-outs", a.calls, b.calls}, {"counters", counted(a, pa), counted(b, pb)},
				{"logs", a.logs, b.logs}, {"shared data", a.shared, b.shared}, {"resumed", a.resumed, b.resumed},
			} {
				if !reflect.DeepEqual(c.a, c.b) {
					t.Fatalf("step %d: %s differ:\n%+v\n%+v", step, c.what, c.a, c.b)
				}
			}
		}
	})
}

// counted is h's counters as p's next tick leaves them, with what p
// counts there (countDeferred).
func counted(h *fakeHost, p *Plugin) map[string]int64 {
	p.countDeferred()
	return maps.Clone(h.counters)
}

// fuzzPlanConfig: on /api/v1/items a request has three limits, the
// second log only, and a POST one more; on /api/v1/other two; on a host
// under example.com either has one more, keyed by user and method (on
// /api/v1/other, the only thing that reads the method).
const fuzzPlanConfig = `{
  "failure_mode": "fail_open",
  "bridge": {"cluster": "bridge", "timeout": "150ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [
    {"name": "api", "match": {"paths": ["/api/**"]}, "limit": 10, "window": "1m", "algorithm": "fixed_window"},
    {"name": "log-only", "match": {"paths": ["/api/**"]}, "limit": 1, "window": "1m", "action": "log_only"},
    {"name": "items", "match": {"paths": ["/api/v1/items"]}, "limit": 5, "window": "1m"},
    {"name": "posts", "match": {"paths": ["/api/v1/items"], "methods": ["POST"]}, "limit": 3, "window": "1m"},
    {"name": "hosted", "match": {"paths": ["/api/**"], "hosts": ["*.example.com"]}, "limit": 4, "window": "1m", "scope": "user+method"}
  ],
  "exemptions": {"users": ["ops"]}
}`

// answer is the bridge's answer for the n limits of a request of
// fuzzPlanConfig: limit i refused for retryMS when bit i of deny is set.
func answer(now int64, n int, deny byte, retryMS int64) string {
	var resp rules.CheckResponse
	resp.Allowed, resp.NowMS = true, now
	for i := range n {
		d := rules.Decision{Allowed: true, Limit: 10, Remaining: 5, ResetMS: now + 60_000}
		if deny&(1<<i) != 0 {
			d = rules.Decision{Allowed: false, Limit: 10, Remaining: 0, ResetMS: now + retryMS, RetryAfterMS: retryMS}
			resp.Allowed = resp.Allowed && i == 1 // the second only logs
		}
		resp.Decisions = append(resp.Decisions, d)
	}
	return string(rules.AppendCheckResponse(nil, &resp))
}

// When a refusal slot's count of keys wraps, the plan cache forgets its
// tags: one kept before could name the slot's key of the moment. Here bob's
// plan is kept when his key is the first its slot holds (count 1); after
// the count is set to wrap, two other keys of that slot take it round to
// 1 again.
func TestStream_RefusalGenerationWraps(t *testing.T) {
	slot := func(user string) uint64 { return rules.Hash([]byte("rl:{u:"+user+"}:api")) % refusalSlots }
	var others []string
	for n := 0; len(others) < 2; n++ {
		if u := fmt.Sprint("u", n); slot(u) == slot("bob") {
			others = append(others, u)
		}
	}
	h, p := newPlugin(t, "fail_open")
	refuse := func(user string) (fast bool) {
		t.Helper()
		s, _ := h.request(p, 3, map[string]string{"x-user-id": user})
		if h.local == nil || h.local.status != 429 {
			t.Fatalf("%s not refused", user)
		}
		return len(s.plan.Limits) == 0
	}
	for _, user := range append([]string{"bob"}, others...) {
		h.request(p, 2, map[string]string{"x-user-id": user})
		h.answer(p, "200", denyAnswer(h.nowMS))
	}
	refuse("bob")
	refuse("bob")
	if r := &p.refusals[slot("bob")]; !refuse("bob") || r.gen != 1 {
		t.Fatalf("bob not refused from the plan cache, or not his slot's first key (%d)", r.gen)
	}
	p.refusals[slot("bob")].gen = ^uint32(0)
	refuse(others[0]) // the count wraps to 0
	refuse(others[1]) // and is 1 again, another key
	if refuse("bob") {
		t.Error("refused from the plan cache by a tag its slot's count wrapped onto")
	}
}

// The refusals the plan cache answers are counted by the next tick, or
// when the VM is done: in the requests, denied and local cache hits
// counters at once, so that requests stays the sum of the outcomes.
func TestPlugin_CountRefusals(t *testing.T) {
	for _, flush := range []string{"tick", "done"} {
		t.Run(flush, func(t *testing.T) {
			h, p := newPlugin(t, "fail_open")
			h.request(p, 2, map[string]string{"x-user-id": "bob"})
			h.answer(p, "200", denyAnswer(h.nowMS)) // the bridge refuses: cached
			// One second: two refusals rendered, four from the plan cache.
			for i := range 6 {
				if h.request(p, 3, map[string]string{"x-user-id": "bob"}); h.local == nil || h.local.status != 429 {
					t.Fatalf("refusal %d: %+v", i+1, h.local)
				}
			}
			counts := func() [4]int64 {
				c := h.counters
				return [4]int64{c[MetricRequests], c[MetricAllowed], c[MetricDenied], c[MetricCacheHits]}
			}
			// requests, allowed, denied, cache hits
			if got, want := counts(), [4]int64{3, 0, 3, 2}; got != want {
				t.Errorf("before: %v, want %v", got, want)
			}
			want := [4]int64{7, 0, 7, 6}
			switch flush {
			case "tick":
				p.OnTick()
			case "done":
				p.OnPluginDone()
			}
			if got := counts(); got != want {
				t.Errorf("after %s: %v, want %v", flush, got, want)
			}
			p.OnTick()
			if got := counts(); got != want {
				t.Errorf("counted again: %v, want %v", got, want)
			}
		})
	}
}
