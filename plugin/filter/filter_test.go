package filter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// fakeHost is a single-VM proxy for native tests: it records what the
// filter does and lets the test answer call-outs.
type fakeHost struct {
	config      []byte
	reqHeaders  map[string]string
	props       map[string]string
	propReads   int
	respHeaders [][2]string
	local       *localResponse
	resumed     int
	calls       []call
	callStatus  string
	callBody    []byte
	dispatchErr error
	effective   uint32
	shared      map[string][]byte
	cas         map[string]uint32
	casSeq      *uint32 // shared by the fake VMs of one proxy
	nowMS       int64
	logs        []string
	metricNames []string
	counters    map[string]int64
	logLevel    proxywasm.LogLevel
	tickMS      uint32
	tickSets    int                // SetTickPeriod calls
	env         map[string]string  // the VM's environment variables
	samples     map[string][]int64 // histograms
	resumedIDs  []uint32           // the effective context of each resume
	pathReads   int                // RequestPath calls
	otherReads  int                // RequestHeaders' and RequestPseudoHeaders calls
	skipped     map[uint32]bool    // streams that skip their response headers
	beforeSet   func()             // runs once, at the next SharedSetCAS, before its write: another VM's moment
	upstream    map[string]string  // the headers of the response being handled (ResponseHeader)
	body        []byte             // the response body part being handled (ReadResponseBody)
}

type localResponse struct {
	status  uint32
	headers map[string]string
	body    string
}

type call struct {
	cluster string
	headers map[string]string
	body    string
	timeout uint32
}

func newFakeHost(config string) *fakeHost {
	return &fakeHost{
		config: []byte(config), shared: map[string][]byte{}, cas: map[string]uint32{}, casSeq: new(uint32), counters: map[string]int64{},
		nowMS: 1_700_000_000_000, props: map[string]string{"source.address": "203.0.113.9:5555"},
	}
}

func (h *fakeHost) PluginConfig() ([]byte, error)      { return h.config, nil }
func (h *fakeHost) RequestHeaders() rules.HeaderSource { return fakeHeaders{h} }

// fakeHeaders reads the fake host's request headers of the moment.
type fakeHeaders struct{ h *fakeHost }

func (f fakeHeaders) Header(n string) string { f.h.otherReads++; return f.h.reqHeaders[n] }

func (h *fakeHost) RequestPath() string { h.pathReads++; return h.reqHeaders[":path"] }
func (h *fakeHost) RequestPseudoHeaders() (string, string, string) {
	h.otherReads++
	return h.reqHeaders[":method"], h.reqHeaders[":path"], h.reqHeaders[":authority"]
}
func (h *fakeHost) Property(p string) string          { h.propReads++; return h.props[p] }
func (h *fakeHost) ResponseHeader(name string) string { return h.upstream[name] }
func (h *fakeHost) RemoveRequestHeader(name string)   { delete(h.reqHeaders, name) }
func (h *fakeHost) ReadResponseBody(size int, w io.Writer) {
	for b := h.body[:min(size, len(h.body))]; len(b) > 0; b = b[min(3, len(b)):] {
		w.Write(b[:min(3, len(b))]) // in parts, as a host may
	}
}
func (h *fakeHost) AddResponseHeader(n string, v []byte) {
	h.respHeaders = append(h.respHeaders, [2]string{n, string(v)})
}
func (h *fakeHost) SendLocalResponse(id, status uint32, serialized []byte, body []byte) {
	h.SkipResponseHeaders(id)
	hdrs, err := proxywasm.ParseHeaderMap(serialized)
	if err != nil {
		panic(err)
	}
	m := map[string]string{}
	for _, kv := range hdrs {
		m[kv[0]] = kv[1]
	}
	h.local = &localResponse{status, m, string(body)}
}
func (h *fakeHost) SkipResponseHeaders(id uint32) {
	if h.skipped == nil {
		h.skipped = map[uint32]bool{}
	}
	h.skipped[id] = true
}
func (h *fakeHost) ResumeRequest() { h.resumed++; h.resumedIDs = append(h.resumedIDs, h.effective) }
func (h *fakeHost) Dispatch(cluster string, hdrs [][2]string, body []byte, timeout uint32) (uint32, error) {
	if h.dispatchErr != nil {
		return 0, h.dispatchErr
	}
	m := map[string]string{}
	for _, kv := range hdrs {
		m[kv[0]] = kv[1]
	}
	h.calls = append(h.calls, call{cluster, m, string(body), timeout})
	return uint32(len(h.calls)), nil
}
func (h *fakeHost) CallResponse(int) (string, []byte) { return h.callStatus, h.callBody }
func (h *fakeHost) SetEffectiveContext(id uint32)     { h.effective = id }
func (h *fakeHost) SharedGetCAS(k string) ([]byte, uint32) {
	v, ok := h.shared[k]
	if !ok {
		return nil, 0
	}
	return v, h.cas[k]
}

// SharedSetCAS follows Envoy: a write to a key that exists with a
// non-zero cas other than its token fails; every write takes a new token.
func (h *fakeHost) SharedSetCAS(k string, v []byte, cas uint32) bool {
	if f := h.beforeSet; f != nil {
		h.beforeSet = nil
		f()
	}
	if _, ok := h.shared[k]; ok && cas != 0 && cas != h.cas[k] {
		return false
	}
	*h.casSeq++
	k = strings.Clone(k) // the plugin's key is a view of its own buffer, as a host copies it
	h.shared[k], h.cas[k] = append([]byte(nil), v...), *h.casSeq
	return true
}
func (h *fakeHost) NowNanos() int64 { return h.nowMS * 1e6 }
func (h *fakeHost) Log(_ proxywasm.LogLevel, m []byte) {
	h.logs = append(h.logs, string(m))
}
func (h *fakeHost) DefineCounter(name string) uint32 {
	h.metricNames = append(h.metricNames, name)
	return uint32(len(h.metricNames) - 1)
}
func (h *fakeHost) IncCounter(id uint32)           { h.counters[h.metricNames[id]]++ }
func (h *fakeHost) AddCounter(id uint32, n int64)  { h.counters[h.metricNames[id]] += n }
func (h *fakeHost) DefineGauge(name string) uint32 { return h.DefineCounter(name) }
func (h *fakeHost) AddGauge(id uint32, n int64)    { h.counters[h.metricNames[id]] += n }
func (h *fakeHost) DefineHistogram(name string) uint32 {
	return h.DefineCounter(name)
}
func (h *fakeHost) Record(id uint32, v int64) {
	if h.samples == nil {
		h.samples = map[string][]int64{}
	}
	h.samples[h.metricNames[id]] = append(h.samples[h.metricNames[id]], v)
}
func (h *fakeHost) LogLevel() proxywasm.LogLevel {
	if h.logLevel == 0 {
		return proxywasm.LogLevelInfo
	}
	return h.logLevel
}
func (h *fakeHost) SetTickPeriod(ms uint32) { h.tickMS = ms; h.tickSets++ }
func (h *fakeHost) Env(name string) (string, bool) {
	v, ok := h.env[name]
	return v, ok
}

// request runs one request's headers through p and returns its stream.
func (h *fakeHost) request(p *Plugin, ctxID uint32, headers map[string]string) (*Stream, proxywasm.Action) {
	h.reqHeaders = map[string]string{":method": "GET", ":path": "/api/v1/items", ":authority": "api.example.com", "x-request-id": "req-1"}
	for k, v := range headers {
		h.reqHeaders[k] = v
	}
	h.local, h.respHeaders = nil, nil
	s := p.NewHTTPContext(ctxID).(*Stream)
	return s, s.OnRequestHeaders(len(h.reqHeaders), true)
}

// tick runs p's tick as the host fires it: when it is due, or now if the
// test moved the clock past that.
func (h *fakeHost) tick(p *Plugin) {
	h.nowMS = max(h.nowMS, p.thr.next)
	p.OnTick()
}

// answer delivers a bridge answer to the last call-out.
func (h *fakeHost) answer(p *Plugin, status string, body string) {
	h.callStatus, h.callBody = status, []byte(body)
	p.OnHTTPCallResponse(uint32(len(h.calls)), 3, len(body), 0)
}

const testConfig = `{
  "failure_mode": "%MODE%",
  "bridge": {"cluster": "bridge", "timeout": "150ms", "token": "t0k"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [
    {"name": "api", "match": {"paths": ["/api/**"]}, "limit": 10, "window": "1m", "algorithm": "fixed_window"},
    {"name": "log-only", "match": {"paths": ["/api/**"]}, "limit": 1, "window": "1m", "action": "log_only"}
  ],
  "exemptions": {"users": ["ops"]},
  "headers": {"strategy": true}
}`

func newPlugin(t *testing.T, mode string) (*fakeHost, *Plugin) {
	t.Helper()
	return startPlugin(t, strings.ReplaceAll(testConfig, "%MODE%", mode))
}

// startPlugin starts a plugin with config on a new fake host.
func startPlugin(t *testing.T, config string) (*fakeHost, *Plugin) {
	t.Helper()
	h := newFakeHost(config)
	p := NewPlugin(h, 1)
	if !p.OnPluginStart(len(h.config)) {
		t.Fatalf("config refused: %v", h.logs)
	}
	return h, p
}

func allowAnswer(now int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: now, Decisions: []rules.Decision{
		{Allowed: true, Limit: 10, Remaining: 7, ResetMS: now + 30_000},
		{Allowed: false, Limit: 1, Remaining: 0, ResetMS: now + 30_000, RetryAfterMS: 30_000},
	}}))
}

func denyAnswer(now int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: false, NowMS: now, Decisions: []rules.Decision{
		{Allowed: false, Limit: 10, Remaining: 0, ResetMS: now + 40_000, RetryAfterMS: 40_000},
		{Allowed: true, Limit: 1, Remaining: 0, ResetMS: now + 40_000},
	}}))
}

func TestPlugin_OnPluginStart(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	good := p.Config()
	h.config = []byte(`{"rules":[{"name":"x","limit":0,"window":"1s"}]}`)
	if p.OnPluginStart(len(h.config)) {
		t.Fatal("invalid config accepted")
	}
	if p.Config() != good {
		t.Error("the previous config must stay in force")
	}
	if last := h.logs[len(h.logs)-1]; !strings.Contains(last, "rules[0].limit") {
		t.Errorf("refusal log does not name the field: %q", last)
	}
	if h.counters[MetricConfigRefused] != 1 {
		t.Error("refusal not counted")
	}
}

func TestStream_OnRequestHeaders_NoMatchAndExempt(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	if _, a := h.request(p, 2, map[string]string{":path": "/health"}); a != proxywasm.Continue || len(h.calls) != 0 {
		t.Errorf("unmatched path: action %v, %d call-outs", a, len(h.calls))
	}
	if _, a := h.request(p, 3, map[string]string{"x-user-id": "ops"}); a != proxywasm.Continue || len(h.calls) != 0 {
		t.Errorf("exempt user: action %v, %d call-outs", a, len(h.calls))
	}
	// The unmatched request is counted by the next tick, the exempt one at
	// once.
	if h.counters[MetricExempt] != 1 || h.counters[MetricRequests] != 1 {
		t.Errorf("counters before the tick: %v", h.counters)
	}
	if c := counted(h, p); c[MetricExempt] != 1 || c[MetricRequests] != 2 {
		t.Errorf("counters: %v", c)
	}
}

// A disabled plugin lets every request through and reads nothing of it.
func TestStream_OnRequestHeaders_Disabled(t *testing.T) {
	h, p := startPlugin(t, `{"enabled": false, "rules": [{"name": "all", "limit": 1, "window": "1s"}]}`)
	for id := uint32(2); id < 5; id++ {
		if _, a := h.request(p, id, map[string]string{"x-user-id": "alice"}); a != proxywasm.Continue || len(h.calls) != 0 || h.local != nil || !h.skipped[id] {
			t.Fatalf("action %v, %d call-outs, local %+v, response headers skipped %v", a, len(h.calls), h.local, h.skipped[id])
		}
	}
	if h.pathReads+h.otherReads != 0 || h.counters[MetricRequests] != 3 {
		t.Errorf("%d path and %d other header reads; counters %v", h.pathReads, h.otherReads, h.counters)
	}
}

// While most requests are ones no limit applies to, their path alone rules
// them out, and nothing else of them is read; while most are not, the
// path is not looked at first. Either way each request is decided as
// evaluating it decides.
func TestStream_PathFirst(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	id := uint32(1)
	send := func(path string) (pathRead, otherRead bool) {
		t.Helper()
		id++
		paths, others, calls := h.pathReads, h.otherReads, len(h.calls)
		_, a := h.request(p, id, map[string]string{":path": path, "x-user-id": "alice"})
		if match := strings.HasPrefix(path, "/api/"); (a == proxywasm.Pause) != match || (len(h.calls) > calls) != match {
			t.Fatalf("%s: action %v, %d call-outs more", path, a, len(h.calls)-calls)
		}
		if len(h.calls) > calls {
			if req, err := rules.DecodeCheckRequest([]byte(h.calls[len(h.calls)-1].body)); err != nil || req.Endpoint != path || req.Limits[0].Key != "rl:{u:alice}:api" {
				t.Fatalf("%s: check %+v, %v", path, req, err)
			}
			h.answer(p, "200", allowAnswer(h.nowMS))
		}
		return h.pathReads > paths, h.otherReads > others
	}
	// share sends n requests, paths in turn, and returns the share of the
	// last half that had their path looked at first, and whether an
	// unmatched one among them read anything else.
	share := func(n int, paths ...string) (float64, bool) {
		t.Helper()
		looked, otherRead := 0, false
		for i := range n {
			path := paths[i%len(paths)]
			pathRead, other := send(path)
			if i >= n/2 && pathRead {
				looked++
				otherRead = otherRead || (other && !strings.HasPrefix(path, "/api/"))
			}
		}
		return float64(looked) / float64(n-n/2), otherRead
	}
	if f, _ := share(200, "/api/a"); f != 0 {
		t.Errorf("every request matching: path looked at first for %.2f", f)
	}
	// Unmatched requests: the path rules them out alone.
	if f, other := share(200, "/health"); f != 1 || other {
		t.Errorf("no request matching: path looked at first for %.2f, other headers read %v", f, other)
	}
	// With three in four unmatched, it stays; the matching ones are read
	// after their path is looked at.
	if f, other := share(400, "/api/b", "/x", "/y", "/z"); f != 1 || other {
		t.Errorf("three in four unmatched: path looked at first for %.2f, other headers read %v", f, other)
	}
	// With one in five, the path is not looked at first.
	if f, _ := share(400, "/api/c", "/api/d", "/api/e", "/api/f", "/z"); f != 0 {
		t.Errorf("one in five unmatched: path looked at first for %.2f", f)
	}
	if c := counted(h, p); c[MetricRequests] != int64(id-1) || c[MetricExempt] != 0 {
		t.Errorf("counters: %v", c)
	}
}

func TestStream_Allowed(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	s, a := h.request(p, 7, map[string]string{"x-user-id": "alice"})
	if a != proxywasm.Pause || len(h.calls) != 1 {
		t.Fatalf("action %v, %d call-outs", a, len(h.calls))
	}
	c := h.calls[0]
	if c.cluster != "bridge" || c.timeout != 150 || c.headers[":path"] != "/v1/rate-limit/check" ||
		c.headers["authorization"] != "Bearer t0k" || c.headers[":method"] != "POST" || c.headers["x-request-id"] != "req-1" {
		t.Errorf("call-out: %+v", c)
	}
	req, err := rules.DecodeCheckRequest([]byte(c.body))
	if err != nil {
		t.Fatalf("check body: %v", err)
	}
	if req.User != "alice" || req.Endpoint != "/api/v1/items" || len(req.Limits) != 2 || !req.Limits[1].LogOnly || req.Limits[0].Key != "rl:{u:alice}:api" {
		t.Errorf("check: %+v", req)
	}
	h.reqHeaders = nil // host memory of the first callback is gone by now
	h.answer(p, "200", allowAnswer(h.nowMS))
	if h.effective != 7 || h.resumed != 1 || h.local != nil {
		t.Fatalf("effective %d resumed %d local %+v", h.effective, h.resumed, h.local)
	}
	s.OnResponseHeaders(0, false)
	got := map[string]string{}
	for _, kv := range h.respHeaders {
		got[kv[0]] = kv[1]
	}
	if got["X-RateLimit-Limit"] != "10" || got["X-RateLimit-Remaining"] != "7" || got["X-RateLimit-Strategy"] != "fixed_window" || got["Retry-After"] != "" {
		t.Errorf("response headers: %v", got)
	}
	// The log_only limit denied: logged, counted, not enforced.
	if h.counters[MetricLogOnlyDenied] != 1 || h.counters[MetricAllowed] != 1 || h.counters[MetricDenied] != 0 {
		t.Errorf("counters: %v", h.counters)
	}
	if !strings.Contains(strings.Join(h.logs, "\n"), `"action":"log_only"`) || !strings.Contains(strings.Join(h.logs, "\n"), `"user_id":"alice"`) {
		t.Errorf("log_only event missing: %v", h.logs)
	}
}

// A stream skips its response headers exactly when the filter has none to
// add: a request let through with nothing to say, or answered locally
// (whose reply carries its headers already); one allowed by the bridge
// gets its limit's headers.
func TestStream_SkipResponseHeaders(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	id := uint32(1)
	type step struct {
		name    string
		headers map[string]string
		answer  func(now int64) string // the bridge's, when it is asked
		skip    bool
	}
	for _, st := range []step{
		{"no limit applies", map[string]string{":path": "/health", "x-user-id": "alice"}, nil, true},
		{"exempt", map[string]string{"x-user-id": "ops"}, nil, true},
		{"allowed by the bridge", map[string]string{"x-user-id": "alice"}, allowAnswer, false},
		{"refused by the bridge", map[string]string{"x-user-id": "bob"}, denyAnswer, true},
		{"refused from the cache", map[string]string{"x-user-id": "bob"}, nil, true},
		{"refused from the cache again", map[string]string{"x-user-id": "bob"}, nil, true},
		{"bridge unreachable, fail_open", map[string]string{"x-user-id": "carol"}, func(int64) string { return "" }, true},
	} {
		id++
		calls := len(h.calls)
		s, _ := h.request(p, id, st.headers)
		if st.answer != nil {
			if len(h.calls) != calls+1 {
				t.Fatalf("%s: no call-out", st.name)
			}
			if body := st.answer(h.nowMS); body != "" {
				h.answer(p, "200", body)
			} else {
				p.OnHTTPCallResponse(uint32(len(h.calls)), 0, 0, 0)
			}
		}
		s.OnResponseHeaders(0, false)
		if h.skipped[id] != st.skip || (st.skip && len(h.respHeaders) != 0) || (!st.skip && len(h.respHeaders) == 0) {
			t.Errorf("%s: skipped %v (want %v), response headers added %v", st.name, h.skipped[id], st.skip, h.respHeaders)
		}
	}
	if h.counters[MetricCacheHits] != 2 {
		t.Errorf("cache hits %d, want 2", h.counters[MetricCacheHits])
	}
}

func TestStream_DeniedThenCached(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	h.request(p, 2, map[string]string{"x-user-id": "bob"})
	h.answer(p, "200", denyAnswer(h.nowMS))
	if h.local == nil || h.local.status != 429 || h.resumed != 0 {
		t.Fatalf("want a local 429, got %+v resumed %d", h.local, h.resumed)
	}
	if h.local.headers["Retry-After"] != "40" || h.local.headers["X-RateLimit-Remaining"] != "0" || h.local.headers["content-type"] != "application/json" {
		t.Errorf("429 headers: %v", h.local.headers)
	}
	if !strings.Contains(h.local.body, `"code":"RATE_LIMITED"`) || !strings.Contains(h.local.body, `"request_id":"req-1"`) {
		t.Errorf("429 body: %s", h.local.body)
	}
	var event string
	for _, l := range h.logs {
		if strings.Contains(l, `"event_type":"blocked"`) && strings.Contains(l, `"action":"reject"`) {
			event = l
		}
	}
	for _, field := range []string{`"user_id":"bob"`, `"ip_address":"203.0.113.9"`, `"endpoint":"/api/v1/items"`, `"limit":10`, `"rule":"api"`, `"timestamp":"2023-11-14T22:13:20.000Z"`} {
		if !strings.Contains(event, field) {
			t.Errorf("blocked event lacks %s: %s", field, event)
		}
	}
	// Ten seconds later the same key is refused from the cache, without a call-out.
	h.nowMS += 10_000
	calls := len(h.calls)
	_, a := h.request(p, 3, map[string]string{"x-user-id": "bob"})
	if a != proxywasm.Pause || len(h.calls) != calls || h.local == nil || h.local.status != 429 {
		t.Fatalf("cache hit: action %v, call-outs %d→%d, local %+v", a, calls, len(h.calls), h.local)
	}
	if h.local.headers["Retry-After"] != "30" || h.counters[MetricCacheHits] != 1 {
		t.Errorf("cached retry-after %q, hits %d", h.local.headers["Retry-After"], h.counters[MetricCacheHits])
	}
	// Another user is not affected; after the retry time bob asks the bridge again.
	h.request(p, 4, map[string]string{"x-user-id": "carol"})
	if len(h.calls) != calls+1 {
		t.Error("another user was answered from bob's cache entry")
	}
	h.nowMS += 31_000
	h.request(p, 5, map[string]string{"x-user-id": "bob"})
	if len(h.calls) != calls+2 {
		t.Error("expired cache entry still used")
	}
}

// A denial is answered from the cache for local_cache.max_hold at most,
// then the bridge is asked again (a limit raised or a counter reset there
// takes effect), while the 429s still show the denial's whole retry time.
func TestStream_CachedDenialHeld(t *testing.T) {
	h, p := startPlugin(t, strings.Replace(strings.ReplaceAll(testConfig, "%MODE%", "fail_open"),
		`"exemptions"`, `"local_cache": {"max_hold": "9500ms"}, "exemptions"`, 1))
	bob := map[string]string{"x-user-id": "bob"}
	// The hold ends between two refusals of one second that show one
	// Retry-After, where the VM answers the second from its rendering.
	t0 := h.nowMS + 300
	h.nowMS = t0
	h.request(p, 2, bob)
	h.answer(p, "200", denyAnswer(h.nowMS)) // retry in 40 s
	calls := len(h.calls)
	for id, at := range []int64{4_500, 9_200, 9_400, 9_499} {
		h.nowMS = t0 + at
		h.local = nil
		if _, a := h.request(p, uint32(3+id), bob); a != proxywasm.Pause || len(h.calls) != calls || h.local == nil {
			t.Fatalf("%d ms after the denial: action %v, call-outs %d→%d", at, a, calls, len(h.calls))
		}
		if want := strconv.FormatInt((40_000-at+999)/1000, 10); h.local.headers["Retry-After"] != want {
			t.Errorf("%d ms after the denial: Retry-After %q, want %s", at, h.local.headers["Retry-After"], want)
		}
	}
	h.nowMS = t0 + 9_500
	h.local = nil
	h.request(p, 7, bob)
	if len(h.calls) != calls+1 {
		t.Fatalf("held past max_hold: call-outs %d→%d", calls, len(h.calls))
	}
	// The bridge does not answer (fail_open): the denial still refuses
	// until its retry time, and is asked about again on the next request.
	p.OnHTTPCallResponse(uint32(len(h.calls)), 0, 0, 0)
	if h.local == nil || h.local.status != 429 || h.local.headers["Retry-After"] != "31" || h.resumed != 0 || h.counters[MetricBridgeErrors] != 1 {
		t.Fatalf("bridge down past the hold: local %+v resumed %d bridge errors %d", h.local, h.resumed, h.counters[MetricBridgeErrors])
	}
	h.local, h.dispatchErr = nil, errors.New("no cluster")
	if _, a := h.request(p, 8, bob); a != proxywasm.Pause || h.local == nil || h.local.status != 429 {
		t.Fatalf("dispatch failed past the hold: action %v local %+v", a, h.local)
	}
	h.dispatchErr = nil
	h.request(p, 9, bob)
	// The bridge now lets bob through (his limit was raised): so does the proxy.
	h.answer(p, "200", allowAnswer(h.nowMS))
	if h.resumed != 1 {
		t.Fatalf("allowed by the bridge, resumed %d", h.resumed)
	}
}

func TestStream_BridgeFailures(t *testing.T) {
	failures := []struct {
		name   string
		answer func(h *fakeHost, p *Plugin)
		reason string
	}{
		{"timeout", func(h *fakeHost, p *Plugin) { p.OnHTTPCallResponse(uint32(len(h.calls)), 0, 0, 0) }, "unreachable or timed out"},
		{"status 503", func(h *fakeHost, p *Plugin) { h.answer(p, "503", `{"error":{}}`) }, "status 503"},
		{"garbage", func(h *fakeHost, p *Plugin) { h.answer(p, "200", `<html>`) }, "not valid JSON"},
		{"wrong count", func(h *fakeHost, p *Plugin) {
			h.answer(p, "200", `{"allowed":true,"decisions":[{"allowed":true}]}`)
		}, "got 1, want 2"},
	}
	for _, mode := range []string{"fail_open", "fail_closed"} {
		for _, f := range failures {
			t.Run(mode+"/"+f.name, func(t *testing.T) {
				h, p := newPlugin(t, mode)
				h.request(p, 2, map[string]string{"x-user-id": "dave"})
				f.answer(h, p)
				if h.counters[MetricBridgeErrors] != 1 {
					t.Errorf("bridge errors: %d", h.counters[MetricBridgeErrors])
				}
				if !strings.Contains(strings.Join(h.logs, "\n"), f.reason) || !strings.Contains(strings.Join(h.logs, "\n"), `"event_type":"backend_error"`) {
					t.Errorf("no backend_error event with %q: %v", f.reason, h.logs)
				}
				if mode == "fail_open" {
					if h.resumed != 1 || h.local != nil || h.counters[MetricFailOpen] != 1 {
						t.Errorf("fail_open: resumed %d local %+v", h.resumed, h.local)
					}
					return
				}
				if h.resumed != 0 || h.local == nil || h.local.status != 503 || !strings.Contains(h.local.body, "SERVICE_UNAVAILABLE") || h.counters[MetricFailClosed] != 1 {
					t.Errorf("fail_closed: resumed %d local %+v", h.resumed, h.local)
				}
			})
		}
	}
}

func TestStream_DispatchError(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		h, p := newPlugin(t, mode)
		h.dispatchErr = errors.New("bad argument")
		_, a := h.request(p, 2, map[string]string{"x-user-id": "erin"})
		if mode == "fail_open" && (a != proxywasm.Continue || h.local != nil) {
			t.Errorf("fail_open: action %v local %+v", a, h.local)
		}
		if mode == "fail_closed" && (a != proxywasm.Pause || h.local == nil || h.local.status != 503) {
			t.Errorf("fail_closed: action %v local %+v", a, h.local)
		}
	}
}

func TestStream_OnDoneDropsLateAnswer(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	s, _ := h.request(p, 2, map[string]string{"x-user-id": "frank"})
	s.OnDone()
	h.answer(p, "200", denyAnswer(h.nowMS))
	if h.local != nil || h.resumed != 0 || p.pending.Len() != 0 {
		t.Errorf("late answer acted on: local %+v resumed %d", h.local, h.resumed)
	}
	// The recycled stream serves the next request cleanly.
	s2, _ := h.request(p, 3, map[string]string{"x-user-id": "gina"})
	if s2 != s {
		t.Error("stream not recycled")
	}
}

// benchHost answers every host call from fixed data without allocating.
type benchHost struct {
	fakeHost
	hdr    map[string]string
	shared map[string][]byte
	locals int // local responses sent
}

func (b *benchHost) RequestHeaders() rules.HeaderSource { return benchHeaders{b} }

type benchHeaders struct{ b *benchHost }

func (h benchHeaders) Header(n string) string { return h.b.hdr[n] }

func (b *benchHost) RequestPath() string { return b.hdr[":path"] }
func (b *benchHost) RequestPseudoHeaders() (string, string, string) {
	return b.hdr[":method"], b.hdr[":path"], b.hdr[":authority"]
}
func (b *benchHost) Property(string) string { return "203.0.113.9:5555" }
func (b *benchHost) SharedGetCAS(k string) ([]byte, uint32) {
	v, ok := b.shared[k]
	if !ok {
		return nil, 0
	}
	return v, b.cas[k]
}

// SharedSetCAS writes into the value's own buffer: no allocation once a
// key has its size.
func (b *benchHost) SharedSetCAS(k string, v []byte, cas uint32) bool {
	cur, ok := b.shared[k]
	if ok && cas != 0 && cas != b.cas[k] {
		return false
	}
	if !ok {
		k = strings.Clone(k) // the plugin's key is a view of its own buffer
	}
	b.shared[k] = append(cur[:0], v...)
	*b.casSeq++
	b.cas[k] = *b.casSeq
	return true
}
func (b *benchHost) Log(proxywasm.LogLevel, []byte)                   {}
func (b *benchHost) IncCounter(uint32)                                {}
func (b *benchHost) AddCounter(uint32, int64)                         {}
func (b *benchHost) AddResponseHeader(string, []byte)                 {}
func (b *benchHost) SendLocalResponse(uint32, uint32, []byte, []byte) { b.locals++ }
func (b *benchHost) SkipResponseHeaders(uint32)                       {}
func (b *benchHost) Dispatch(string, [][2]string, []byte, uint32) (uint32, error) {
	return 1, nil
}

// BenchmarkStream measures the filter per request, natively: (a) no rule
// matches, (b) over-limit cache hit, (c) a lease hit, (d) the call-out
// path without network, and the same for a client new to the plan cache.
// The same paths run in the built .wasm in plugin/wasm_test.go.
func BenchmarkStream(b *testing.B) {
	h := &benchHost{fakeHost: *newFakeHost(strings.ReplaceAll(testConfig, "%MODE%", "fail_open")), shared: map[string][]byte{}}
	p := NewPlugin(h, 1)
	if !p.OnPluginStart(0) {
		b.Fatal("config refused")
	}
	base := map[string]string{":method": "GET", ":authority": "api.example.com", "x-request-id": "req-1", "x-user-id": "alice"}
	with := func(path string) map[string]string {
		m := map[string]string{":path": path}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	run := func(b *testing.B, hdr map[string]string, after func()) {
		h.hdr = hdr
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			s := p.NewHTTPContext(uint32(i + 2)).(*Stream)
			s.OnRequestHeaders(0, true)
			if after != nil {
				after()
			}
			s.OnResponseHeaders(0, false)
			s.OnDone()
		}
	}
	b.Run("no-match", func(b *testing.B) { run(b, with("/health"), nil) })
	b.Run("cache-hit", func(b *testing.B) {
		p.cacheDenial(p.cfg, []byte("rl:{u:alice}:api"), &rules.Decision{Limit: 10, ResetMS: 1 << 50, RetryAfterMS: 1 << 49}, h.nowMS)
		locals := h.locals
		run(b, with("/api/v1/items"), nil)
		if h.locals-locals != b.N {
			b.Fatalf("%d of %d requests refused from the cache", h.locals-locals, b.N)
		}
	})
	b.Run("lease-hit", func(b *testing.B) {
		// A proxy of its own: a leased rule, a lease that outlasts the run.
		lh := &benchHost{fakeHost: *newFakeHost(benchLeaseConfig), shared: map[string][]byte{}}
		lp := NewPlugin(lh, 1)
		if !lp.OnPluginStart(0) {
			b.Fatal("config refused")
		}
		lp.install(lp.cfg, []byte("rl:{g}:hot"), &lp.cfg.Rules[0].Spec,
			&rules.Decision{Limit: 1 << 40, Remaining: 0, ResetMS: 1 << 50, Lease: rules.LeaseGrant{Units: 1 << 40, TTLMS: 60_000, Tag: 1}}, lh.nowMS)
		lh.hdr = with("/hot/x")
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			s := lp.NewHTTPContext(uint32(i + 2)).(*Stream)
			if s.OnRequestHeaders(0, true) != proxywasm.Continue {
				b.Fatal("not answered from the lease")
			}
			s.OnResponseHeaders(0, false)
			s.OnDone()
		}
	})
	b.Run("call-out", func(b *testing.B) {
		h.shared = map[string][]byte{}
		answer := []byte(allowAnswer(h.nowMS))
		h.callStatus, h.callBody = "200", answer
		hdr := with("/api/v1/x")
		hdr["x-user-id"] = "carol" // alice's key is refused (cache-hit above)
		locals := h.locals
		run(b, hdr, func() { p.OnHTTPCallResponse(1, 3, len(answer), 0) })
		if h.locals != locals {
			b.Fatal("refused: not the call-out path")
		}
	})
	// The call-out path of a client the plan cache does not hold: users
	// that come back only after thousands of others.
	b.Run("call-out-new-client", func(b *testing.B) {
		answer := []byte(allowAnswer(h.nowMS))
		h.callStatus, h.callBody = "200", answer
		users := make([]string, 4096)
		for i := range users {
			users[i] = "client-" + strconv.Itoa(i)
		}
		hdr := with("/api/v1/x")
		h.hdr = hdr
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			hdr["x-user-id"] = users[i%len(users)]
			s := p.NewHTTPContext(uint32(i + 2)).(*Stream)
			s.OnRequestHeaders(0, true)
			p.OnHTTPCallResponse(1, 3, len(answer), 0)
			s.OnResponseHeaders(0, false)
			s.OnDone()
		}
	})
}

// benchLeaseConfig leases one global key for longer than any benchmark.
const benchLeaseConfig = `{
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [{"name": "hot", "match": {"paths": ["/hot/**"]}, "scope": "global", "limit": 1099511627776, "window": "1h",
             "algorithm": "fixed_window", "lease": {"size": 1099511627776, "ttl": "1m"}}]
}`

func TestAppendTimestamp(t *testing.T) {
	for _, ms := range []int64{0, 951782400000, 1_700_000_000_123, 4102444799999, 1709164800000} {
		want := time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
		if got := string(appendTimestamp(nil, ms)); got != want {
			t.Errorf("%d: got %s, want %s", ms, got, want)
		}
	}
}

func TestStream_AllowedEventAtDebug(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	if h.tickMS != 1000 {
		t.Errorf("tick period %d, want 1000", h.tickMS)
	}
	allowedEvents := func() (n int) {
		for _, l := range h.logs {
			if strings.Contains(l, `"event_type":"allowed"`) {
				n++
			}
		}
		return n
	}
	h.request(p, 2, map[string]string{"x-user-id": "ivy"})
	h.answer(p, "200", allowAnswer(h.nowMS))
	if n := allowedEvents(); n != 0 {
		t.Fatalf("allowed event at info level: %d", n)
	}
	h.logLevel = proxywasm.LogLevelDebug
	h.tick(p)
	h.request(p, 3, map[string]string{"x-user-id": "ivy"})
	h.answer(p, "200", allowAnswer(h.nowMS))
	if n := allowedEvents(); n != 1 {
		t.Fatalf("allowed events at debug: %d, want 1: %v", n, h.logs)
	}
}

// Events and the 429 body are JSON whatever the client sent: valid UTF-8
// is logged as the same text, other bytes as U+FFFD.
func TestStream_EventsKeepText(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	h.request(p, 2, map[string]string{"x-user-id": "josé", ":path": "/api/v1/café", "x-request-id": "r-\xff"})
	h.answer(p, "200", denyAnswer(h.nowMS))
	var body struct {
		Error struct {
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(h.local.body), &body); err != nil || body.Error.RequestID != "r-\ufffd" {
		t.Errorf("429 body %s: %v, request_id %q", h.local.body, err, body.Error.RequestID)
	}
	var ev struct {
		User      string `json:"user_id"`
		Endpoint  string `json:"endpoint"`
		RequestID string `json:"request_id"`
		EventType string `json:"event_type"`
	}
	for _, l := range h.logs {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("event is not JSON: %v: %s", err, l)
		}
	}
	if ev.EventType != "blocked" || ev.User != "josé" || ev.Endpoint != "/api/v1/café" || ev.RequestID != "r-\ufffd" {
		t.Errorf("blocked event: %+v", ev)
	}
}

// Whatever x-request-id a client sends, the check it leads to is one the
// bridge accepts: the id is cut at a character boundary, and left out of
// the check when it is not UTF-8.
func TestStream_RequestIDAlwaysDecodes(t *testing.T) {
	tests := []struct{ sent, want string }{
		{strings.Repeat("\xff", 200), ""},
		{strings.Repeat("é", 100), strings.Repeat("é", 64)},
		{strings.Repeat("a", 127) + "é", strings.Repeat("a", 127)},
		{"ok-1", "ok-1"},
	}
	for _, tc := range tests {
		h, p := newPlugin(t, "fail_open")
		h.request(p, 2, map[string]string{"x-user-id": "kim", "x-request-id": tc.sent})
		req, err := rules.DecodeCheckRequest([]byte(h.calls[0].body))
		if err != nil {
			t.Errorf("x-request-id of %d bytes: the bridge would refuse the check: %v", len(tc.sent), err)
			continue
		}
		if req.RequestID != tc.want {
			t.Errorf("x-request-id %q: check carries %q, want %q", tc.sent, req.RequestID, tc.want)
		}
	}
}

// The VM's environment gives the chat, upload and auth categories their
// defaults; what the configuration says explicitly wins.
func TestPlugin_OnPluginStartEnvironment(t *testing.T) {
	const cfg = `{"categories":[
		{"name":"chat","paths":["/chat"]},
		{"name":"upload","paths":["/upload"],"limit":7},
		{"name":"auth","paths":["/login"]}]}`
	h := newFakeHost(cfg)
	h.env = map[string]string{
		"RATE_LIMIT_CHAT_REQUESTS": "25", "RATE_LIMIT_CHAT_WINDOW": "30",
		"RATE_LIMIT_UPLOAD_REQUESTS": "3", "RATE_LIMIT_UPLOAD_WINDOW": "1h",
	}
	p := NewPlugin(h, 1)
	if !p.OnPluginStart(len(h.config)) {
		t.Fatalf("config refused: %v", h.logs)
	}
	got := map[string]rules.LimitSpec{}
	for _, c := range p.Config().Categories {
		got[c.Name] = c.Spec
	}
	for name, want := range map[string][2]int64{
		"chat":   {25, 30_000},  // both from the environment
		"upload": {7, 3600_000}, // limit from the config, window from the environment
		"auth":   {5, 60_000},   // built-in defaults
	} {
		if s := got[name]; s.Limit != want[0] || s.WindowMS != want[1] {
			t.Errorf("%s: %d per %dms, want %d per %dms", name, s.Limit, s.WindowMS, want[0], want[1])
		}
	}

	// A bad value is refused by the variable's name; the configuration in
	// force stays.
	good := p.Config()
	h.env["RATE_LIMIT_AUTH_WINDOW"] = "soon"
	if p.OnPluginStart(len(h.config)) || p.Config() != good {
		t.Fatal("a bad environment variable was accepted")
	}
	if last := h.logs[len(h.logs)-1]; !strings.Contains(last, "RATE_LIMIT_AUTH_WINDOW") {
		t.Errorf("refusal does not name the variable: %q", last)
	}
}

// panicking runs f as the binding runs a callback: a panic is recovered and
// handed to OnPanic, whose action is returned.
func panicking(p *Plugin, ctx proxywasm.HTTPContext, f func() proxywasm.Action) (a proxywasm.Action, panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			a, panicked = p.OnPanic(0, ctx, v), true
		}
	}()
	return f(), false
}

func TestPlugin_OnPanic(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		t.Run(mode+"/request", func(t *testing.T) {
			h, p := newPlugin(t, mode)
			h.env = map[string]string{testPanicEnv: "1"}
			if !p.OnPluginStart(0) {
				t.Fatal("configuration refused")
			}
			h.reqHeaders = map[string]string{":path": "/api/v1/items", "x-user-id": "ann", testPanicHeader: "request"}
			s := p.NewHTTPContext(2).(*Stream)
			a, panicked := panicking(p, s, func() proxywasm.Action { return s.OnRequestHeaders(3, true) })
			if !panicked || h.counters[MetricPanics] != 1 || len(h.calls) != 0 {
				t.Fatalf("panicked %v, panics %d, calls %d", panicked, h.counters[MetricPanics], len(h.calls))
			}
			if mode == "fail_open" && (a != proxywasm.Continue || h.local != nil) {
				t.Errorf("fail_open: action %v, local %+v", a, h.local)
			}
			if mode == "fail_closed" && (a != proxywasm.Pause || h.local == nil || h.local.status != 503 || !strings.Contains(h.local.body, "plugin error")) {
				t.Errorf("fail_closed: action %v, local %+v", a, h.local)
			}
			// The next request of the same VM is served as usual.
			s.OnDone()
			if _, a := h.request(p, 3, map[string]string{"x-user-id": "ann"}); a != proxywasm.Pause || len(h.calls) != 1 {
				t.Errorf("next request: action %v, calls %d", a, len(h.calls))
			}
		})
		t.Run(mode+"/callout", func(t *testing.T) {
			h, p := newPlugin(t, mode)
			h.env = map[string]string{testPanicEnv: "1"}
			p.OnPluginStart(0)
			h.request(p, 2, map[string]string{"x-user-id": "bob", testPanicHeader: "callout"})
			h.callStatus, h.callBody = "200", []byte(`{"allowed":true}`)
			_, panicked := panicking(p, nil, func() proxywasm.Action {
				p.OnHTTPCallResponse(uint32(len(h.calls)), 3, len(h.callBody), 0)
				return proxywasm.Continue
			})
			if !panicked || h.counters[MetricPanics] != 1 || p.pending.Len() != 0 {
				t.Fatalf("panicked %v, panics %d, pending %d", panicked, h.counters[MetricPanics], p.pending.Len())
			}
			if mode == "fail_open" && (h.resumed != 1 || h.local != nil) {
				t.Errorf("fail_open: resumed %d, local %+v", h.resumed, h.local)
			}
			if mode == "fail_closed" && (h.resumed != 0 || h.local == nil || h.local.status != 503) {
				t.Errorf("fail_closed: resumed %d, local %+v", h.resumed, h.local)
			}
		})
	}
	t.Run("answered", func(t *testing.T) {
		// A panic after the request was answered answers nothing twice.
		h, p := newPlugin(t, "fail_closed")
		s, _ := h.request(p, 2, map[string]string{"x-user-id": "cy"})
		h.answer(p, "200", `{"allowed":true,"decisions":[{"allowed":true,"limit":10,"remaining":9},{"allowed":true,"limit":1,"remaining":0}]}`)
		a, _ := panicking(p, s, func() proxywasm.Action { panic("after the answer") })
		if a != proxywasm.Continue || h.resumed != 1 || h.local != nil || h.counters[MetricPanics] != 1 {
			t.Errorf("action %v, resumed %d, local %+v", a, h.resumed, h.local)
		}
	})
	t.Run("off", func(t *testing.T) {
		// Without the VM environment variable the header does nothing.
		h, p := newPlugin(t, "fail_closed")
		_, a := h.request(p, 2, map[string]string{"x-user-id": "dee", testPanicHeader: "request"})
		if a != proxywasm.Pause || len(h.calls) != 1 || h.counters[MetricPanics] != 0 {
			t.Errorf("action %v, calls %d", a, len(h.calls))
		}
	})
}

// Refusals from the over-limit cache reuse their rendering and report one
// blocked event per key per second, with the number of refusals and the
// fields of the first of them.
func TestStream_CacheRefusalsAggregated(t *testing.T) {
	h, p := newPlugin(t, "fail_open")
	h.request(p, 2, map[string]string{"x-user-id": "bob"})
	h.answer(p, "200", denyAnswer(h.nowMS)) // the bridge refuses: cached for 40s
	events := func() []string {
		var out []string
		for _, l := range h.logs {
			if strings.Contains(l, `"source":"local_cache"`) {
				out = append(out, l)
			}
		}
		return out
	}
	refuse := func(id string) *localResponse {
		t.Helper()
		if _, a := h.request(p, 3, map[string]string{"x-user-id": "bob", "x-request-id": id}); a != proxywasm.Pause || h.local == nil || h.local.status != 429 {
			t.Fatalf("request %s: action %v, local %+v", id, a, h.local)
		}
		return h.local
	}
	calls := len(h.calls)
	first := refuse("r1")
	refuse("r2")
	reads := h.propReads
	for i := 3; i <= 5; i++ { // the same second
		l := refuse(fmt.Sprint("r", i))
		if l.headers["Retry-After"] != first.headers["Retry-After"] || !strings.Contains(l.body, fmt.Sprintf(`"request_id":"r%d"`, i)) ||
			strings.Replace(l.body, fmt.Sprintf("r%d", i), "r1", 1) != first.body {
			t.Fatalf("refusal %d: %+v, first %+v", i, l, first)
		}
	}
	if ev := events(); len(ev) != 1 || !strings.Contains(ev[0], `"count":1`) || !strings.Contains(ev[0], `"request_id":"r1"`) {
		t.Fatalf("events after 5 refusals in one second: %q", ev)
	}
	// The key is by user: only the refusal an event will describe asks
	// for the client's address.
	if h.propReads != reads {
		t.Errorf("refusals 3 to 5 read %d properties", h.propReads-reads)
	}
	h.nowMS += 1000
	if l := refuse("r6"); l.headers["Retry-After"] != "39" {
		t.Errorf("a second later Retry-After = %q, want 39", l.headers["Retry-After"])
	}
	if ev := events(); len(ev) != 2 || !strings.Contains(ev[1], `"count":5`) || !strings.Contains(ev[1], `"request_id":"r2"`) ||
		!strings.Contains(ev[1], `"user_id":"bob"`) || !strings.Contains(ev[1], `"ip_address":"203.0.113.9"`) || !strings.Contains(ev[1], `"retry_after":39`) {
		t.Fatalf("the next second's event: %q", ev)
	}
	refuse("r7")
	refuse("r8")
	h.nowMS += 1000
	h.tick(p) // the tick reports what no later refusal did
	if ev := events(); len(ev) != 3 || !strings.Contains(ev[2], `"count":2`) || !strings.Contains(ev[2], `"request_id":"r7"`) {
		t.Fatalf("events after the tick: %q", ev)
	}
	if len(h.calls) != calls || h.counters[MetricCacheHits] != 8 || h.counters[MetricDenied] != 9 {
		t.Errorf("call-outs %d→%d, cache hits %d, denied %d", calls, len(h.calls), h.counters[MetricCacheHits], h.counters[MetricDenied])
	}
}

// keyHash spreads similar keys over the cache's slots and the refusal
// memo: each byte, wherever in the key, moves the low bits.
func TestKeyHash_Spreads(t *testing.T) {
	for _, slots := range []uint64{refusalSlots, 1000, 1 << 14} {
		counts := make([]int, slots)
		const keys = 100_000
		for i := 0; i < keys; i++ {
			counts[rules.Hash([]byte(fmt.Sprintf("rl:{u:user%d}:api", i)))%slots]++
		}
		want := float64(keys) / float64(slots)
		for slot, n := range counts {
			if d := float64(n) - want; d*d > 25*want+100 { // 5 standard deviations (and some)
				t.Fatalf("%d slots: slot %d holds %d keys, want about %.0f", slots, slot, n, want)
			}
		}
	}
	if rules.Hash([]byte("rl:{u:a}:x")) == rules.Hash([]byte("rl:{u:b}:x")) || rules.Hash([]byte("12345678a")) == rules.Hash([]byte("12345678b")) {
		t.Error("keys one byte apart hash alike")
	}
}
