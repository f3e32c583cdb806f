package filter

import (
	"errors"
	"maps"
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

const bodyChargeConfig = `{
  "bridge": {"cluster": "bridge", "timeout": "150ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [
    {"name": "llm", "match": {"paths": ["/v1/**"]}, "limit": 100000, "window": "1h",
     "on_response": {"statuses": ["2xx"], "cost_body": "usage.total_tokens"}},
    {"name": "calls", "match": {"paths": ["/v1/**"]}, "limit": 1000, "window": "1h", "on_response": {"cost_header": "x-cost"}}
  ]
}`

// body runs s's body callbacks for parts, the last one ending the stream,
// and returns the call-outs they sent.
func (h *fakeHost) bodyParts(s *Stream, parts ...string) []call {
	n := len(h.calls)
	for i, part := range parts {
		h.body = []byte(part)
		s.OnResponseBody(len(part), i == len(parts)-1)
	}
	return h.calls[n:]
}

// charged decodes the one charge among calls: rule → cost.
func charged(t *testing.T, calls []call) map[string]int64 {
	t.Helper()
	if len(calls) != 1 {
		t.Fatalf("%d charges, want 1", len(calls))
	}
	req, err := rules.DecodeCheckRequest([]byte(calls[0].body))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, l := range req.Limits {
		m[l.Rule] = l.Spec.Cost
	}
	return m
}

// A limit whose cost is in the response body is charged at the body's
// end, what its JSON (or the last data line of its event stream) says,
// with the stream's other limits; a body cut short, at the stream's end,
// with what it said so far; a status it does not charge, or a response
// without a body, at once.
func TestStream_ChargeFromBody(t *testing.T) {
	h, p := startPlugin(t, bodyChargeConfig)
	allowed := func() string {
		return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: h.nowMS, Decisions: []rules.Decision{
			{Allowed: true, Limit: 100000, Remaining: 100000, ResetMS: h.nowMS + 60_000},
			{Allowed: true, Limit: 1000, Remaining: 1000, ResetMS: h.nowMS + 60_000},
		}}))
	}
	start := func(id uint32) *Stream {
		s, _ := h.request(p, id, map[string]string{":path": "/v1/chat", "x-user-id": "alice"})
		h.answer(p, "200", allowed())
		return s
	}
	tests := []struct {
		name    string
		headers []string
		parts   []string
		done    bool // the stream ends before the body's end
		want    map[string]int64
	}{
		{"a JSON answer", []string{"content-type", "application/json", "x-cost", "2"},
			[]string{`{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,`, `"total_tokens":12}}`},
			false, map[string]int64{"llm": 12, "calls": 2}},
		{"an event stream", []string{"content-type", "text/event-stream; charset=utf-8"},
			[]string{"data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tok", "ens\":7}}\n\ndata: [DONE]\n\n"},
			false, map[string]int64{"llm": 7, "calls": 1}},
		{"no number: the limit's cost", []string{"content-type", "application/json"}, []string{`{"usage":{}}`},
			false, map[string]int64{"llm": 1, "calls": 1}},
		{"cut short after the number", []string{"content-type", "application/json"}, []string{`{"usage":{"total_tokens":40},"id":`},
			true, map[string]int64{"llm": 40, "calls": 1}},
		{"cut short before it", []string{"content-type", "application/json"}, []string{`{"choices":[`},
			true, map[string]int64{"llm": 1, "calls": 1}},
	}
	for i, tc := range tests {
		s := start(uint32(10 + i))
		if calls := h.respond(s, "200", tc.headers...); len(calls) != 0 {
			t.Fatalf("%s: %d charges before the body", tc.name, len(calls))
		}
		var calls []call
		if tc.done {
			h.body = []byte(tc.parts[0])
			s.OnResponseBody(len(tc.parts[0]), false)
			n := len(h.calls)
			s.OnDone()
			calls = h.calls[n:]
		} else {
			calls = h.bodyParts(s, tc.parts...)
			s.OnDone()
		}
		if got := charged(t, calls); !maps.Equal(got, tc.want) {
			t.Errorf("%s: charged %v, want %v", tc.name, got, tc.want)
		}
	}

	// A status the body's limit does not charge: the rest at once, the
	// body not read.
	s := start(20)
	if got := charged(t, h.respond(s, "500", "x-cost", "3")); !maps.Equal(got, map[string]int64{"calls": 3}) {
		t.Errorf("a 500: charged %v", got)
	}
	if calls := h.bodyParts(s, `{"usage":{"total_tokens":9}}`); len(calls) != 0 {
		t.Errorf("a 500's body charged %d times", len(calls))
	}
	s.OnDone()
	// No body at all: charged at the headers, the limit's cost.
	s = start(21)
	h.upstream = map[string]string{":status": "204"}
	n := len(h.calls)
	s.OnResponseHeaders(1, true)
	if got := charged(t, h.calls[n:]); !maps.Equal(got, map[string]int64{"llm": 1, "calls": 1}) {
		t.Errorf("no body: charged %v", got)
	}
	s.OnDone()
	// A compressed body cannot be read: charged at the headers, the
	// limit's cost; an identity one is read.
	s = start(22)
	if got := charged(t, h.respond(s, "200", "content-encoding", "gzip")); !maps.Equal(got, map[string]int64{"llm": 1, "calls": 1}) {
		t.Errorf("a compressed answer: charged %v", got)
	}
	s.OnDone()
	s = start(23)
	h.respond(s, "200", "content-encoding", "Identity")
	if got := charged(t, h.bodyParts(s, `{"usage":{"total_tokens":3}}`)); !maps.Equal(got, map[string]int64{"llm": 3, "calls": 1}) {
		t.Errorf("an identity-encoded answer: charged %v", got)
	}
	s.OnDone()
	// Counted: the answers without a number, cut short before it, without
	// a body, compressed.
	if n := h.counters[MetricBodyUnread]; n != 4 {
		t.Errorf("%d bodies unread, want 4", n)
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream": true, "text/event-stream; charset=utf-8": true, "Text/Event-Stream": true,
		"text/event-streams": false, "application/json": false, "": false, "text/event": false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

// A request whose cost its answer's body says goes upstream without
// Accept-Encoding, so that the answer comes readable; other requests keep
// theirs.
func TestStream_ChargeFromBodyAsksUncompressed(t *testing.T) {
	h, p := startPlugin(t, bodyChargeConfig)
	h.request(p, 2, map[string]string{":path": "/v1/chat", "x-user-id": "alice", "accept-encoding": "gzip, br"})
	if v, ok := h.reqHeaders["accept-encoding"]; ok {
		t.Errorf("accept-encoding %q went upstream", v)
	}
	h, p = startPlugin(t, strings.ReplaceAll(chargeConfig, "%MODE%", "fail_open"))
	h.request(p, 2, map[string]string{":path": "/v1/chat", "x-user-id": "alice", "accept-encoding": "gzip"})
	if h.reqHeaders["accept-encoding"] != "gzip" {
		t.Error("accept-encoding removed from a request whose cost is not in the body")
	}
}
