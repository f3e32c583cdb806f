package filter

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

const chargeConfig = `{
  "failure_mode": "%MODE%",
  "bridge": {"cluster": "bridge", "timeout": "150ms", "token": "t0k"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "penalty": {},
  "rules": [
    {"name": "tokens", "match": {"paths": ["/v1/**"]}, "limit": 100000, "window": "1h", "algorithm": "fixed_window",
     "on_response": {"statuses": ["2xx"], "cost_header": "x-usage-tokens"}},
    {"name": "logins", "match": {"paths": ["/v1/**"]}, "scope": "ip", "limit": 5, "window": "15m", "on_response": {"statuses": [401]}},
    {"name": "api", "match": {"paths": ["/v1/**"]}, "limit": 10, "window": "1m"}
  ]
}`

// respond runs s's response headers callback for a response with status
// and headers, and returns the call-outs it sent.
func (h *fakeHost) respond(s *Stream, status string, headers ...string) []call {
	h.upstream = map[string]string{":status": status}
	for i := 0; i+1 < len(headers); i += 2 {
		h.upstream[headers[i]] = headers[i+1]
	}
	n := len(h.calls)
	if h.skipped[s.id] {
		return nil // the host does not run the callback
	}
	s.OnResponseHeaders(len(h.upstream), false)
	return h.calls[n:]
}

// chargeAllowed is the bridge allowing the three limits of chargeConfig.
func chargeAllowed(now int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: now, Decisions: []rules.Decision{
		{Allowed: true, Limit: 100000, Remaining: 4000, ResetMS: now + 60_000},
		{Allowed: true, Limit: 5, Remaining: 5, ResetMS: now + 60_000},
		{Allowed: true, Limit: 10, Remaining: 9, ResetMS: now + 60_000},
	}}))
}

// A limit charged after the response: the request's check only asks
// whether it has anything left; the response's status and cost header
// decide what one more call-out charges, each limit on its own. A request
// let through by fail_open is charged too; one the proxy refused is not.
func TestStream_ChargeOnResponse(t *testing.T) {
	h, p := startPlugin(t, strings.ReplaceAll(chargeConfig, "%MODE%", "fail_open"))
	user := map[string]string{":path": "/v1/chat", "x-user-id": "alice"}

	s, a := h.request(p, 2, user)
	if a != proxywasm.Pause || len(h.calls) != 1 {
		t.Fatalf("action %v, %d call-outs", a, len(h.calls))
	}
	check, err := rules.DecodeCheckRequest([]byte(h.calls[0].body))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		fill bool
		cost int64
	}{{true, 0}, {true, 0}, {false, 1}} {
		if l := check.Limits[i]; l.Fill != want.fill || l.Spec.Cost != want.cost || l.Spec.Penalty == nil {
			t.Errorf("check's limit %s: fill %v cost %d penalty %v, want %+v and the penalty", l.Rule, l.Fill, l.Spec.Cost, l.Spec.Penalty, want)
		}
	}
	h.answer(p, "200", chargeAllowed(h.nowMS))
	if h.resumed != 1 || h.skipped[2] {
		t.Fatalf("resumed %d, response headers skipped %v", h.resumed, h.skipped[2])
	}
	calls := h.respond(s, "200", "x-usage-tokens", "1234")
	if len(calls) != 1 {
		t.Fatalf("%d charges after a 200", len(calls))
	}
	if c := calls[0]; c.cluster != "bridge" || c.headers["x-request-id"] != "req-1" || c.headers["authorization"] != "Bearer t0k" || c.headers[":path"] != "/v1/rate-limit/check" {
		t.Errorf("charge call-out %+v", c)
	}
	charge, err := rules.DecodeCheckRequest([]byte(calls[0].body))
	if err != nil {
		t.Fatal(err)
	}
	if len(charge.Limits) != 1 || charge.User != "alice" || charge.Endpoint != "/v1/chat" {
		t.Fatalf("charge %+v", charge)
	}
	if l := charge.Limits[0]; l.Rule != "tokens" || l.Key != check.Limits[0].Key || !l.Fill || !l.LogOnly || l.Spec.Cost != 1234 || l.Spec.Penalty != nil {
		t.Errorf("charged %+v", l)
	}
	// Its answer only counts.
	h.answer(p, "200", `{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":100000,"remaining":4000,"reset_ms":2,"retry_after_ms":0}]}`)
	if h.counters[MetricCharges] != 1 || h.counters[MetricChargeErrors] != 0 || h.resumed != 1 {
		t.Errorf("counters %v, resumed %d", h.counters, h.resumed)
	}
	s.OnDone()

	// A failed login: the tokens limit charges only 2xx; logins its cost.
	s, _ = h.request(p, 3, user)
	h.answer(p, "200", chargeAllowed(h.nowMS))
	calls = h.respond(s, "401")
	if len(calls) != 1 {
		t.Fatalf("%d charges after a 401", len(calls))
	}
	if charge, err = rules.DecodeCheckRequest([]byte(calls[0].body)); err != nil || len(charge.Limits) != 1 || charge.Limits[0].Rule != "logins" || charge.Limits[0].Spec.Cost != 1 {
		t.Fatalf("charge after a 401: %+v %v", charge, err)
	}
	h.answer(p, "503", "")
	if h.counters[MetricChargeErrors] != 1 || !strings.Contains(h.logs[len(h.logs)-1], `"event_type":"charge_error","reason":"bridge answered status 503"`) {
		t.Errorf("a charge refused: counters %v, log %q", h.counters, h.logs[len(h.logs)-1])
	}
	s.OnDone()

	// A response that costs nothing charges nothing: a 302, a 200 of 0 tokens.
	for id, resp := range map[uint32][]string{4: {"302"}, 5: {"200", "x-usage-tokens", "0"}} {
		s, _ = h.request(p, id, user)
		h.answer(p, "200", chargeAllowed(h.nowMS))
		if calls := h.respond(s, resp[0], resp[1:]...); len(calls) != 0 {
			t.Errorf("%v: %d charges", resp, len(calls))
		}
		s.OnDone()
	}

	// fail_open lets the request through, and charges it after all.
	s, _ = h.request(p, 6, user)
	h.answer(p, "500", "")
	if h.resumed != 5 || h.skipped[6] {
		t.Fatalf("fail_open: resumed %d, response headers skipped %v", h.resumed, h.skipped[6])
	}
	if calls := h.respond(s, "200", "x-usage-tokens", "7"); len(calls) != 1 {
		t.Errorf("%d charges after fail_open", len(calls))
	}
	s.OnDone()

	// Refused: the proxy's own 429 is never charged.
	s, _ = h.request(p, 7, user)
	h.answer(p, "200", string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: false, NowMS: h.nowMS, Decisions: []rules.Decision{
		{Allowed: false, Limit: 100000, Remaining: 0, ResetMS: h.nowMS + 60_000, RetryAfterMS: 60_000},
		{Allowed: true, Limit: 5, Remaining: 5, ResetMS: h.nowMS + 60_000},
		{Allowed: true, Limit: 10, Remaining: 9, ResetMS: h.nowMS + 60_000},
	}})))
	if h.local == nil || h.local.status != 429 {
		t.Fatalf("spent tokens: local %+v", h.local)
	}
	if calls := h.respond(s, "429"); len(calls) != 0 {
		t.Errorf("%d charges of a refused request", len(calls))
	}
	s.OnDone()

	// alice's refusal is cached now; bob's requests go on. A charge that
	// cannot be sent is counted and logged.
	if _, a := h.request(p, 8, user); a != proxywasm.Pause || h.local == nil || h.counters[MetricCacheHits] != 1 {
		t.Fatalf("alice again: action %v, local %+v", a, h.local)
	}
	s, _ = h.request(p, 9, map[string]string{":path": "/v1/chat", "x-user-id": "bob"})
	h.answer(p, "200", chargeAllowed(h.nowMS))
	h.dispatchErr = errors.New("no such cluster")
	h.respond(s, "200")
	if h.counters[MetricCharges] != 4 || h.counters[MetricChargeErrors] != 2 {
		t.Errorf("counters %v", h.counters)
	}
}

// Without a limit charged after the response, fail_open still skips the
// response headers: nothing is added to them and nothing charged.
func TestStream_FailOpenSkipsResponse(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	h.request(p, 2, map[string]string{"x-user-id": "alice"})
	h.answer(p, "500", "")
	if h.resumed != 1 || !h.skipped[2] {
		t.Errorf("resumed %d, response headers skipped %v", h.resumed, h.skipped[2])
	}
}
