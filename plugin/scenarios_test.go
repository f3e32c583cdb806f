//go:build !wasip1

package main

// Scenarios every engine runs the built plugin through (the same build as
// `make wasm`): the project's wazero host (wasm_test.go) and V8, Envoy's
// default engine, through Node.js (v8_test.go). An engine is a proxy with
// two worker VMs, unless a scenario asks otherwise, whose cluster "bridge"
// is an httptest fake bridge; the scenarios assert what clients, the
// bridge and the operator see. The filter's logic is unit-tested natively
// in plugin/filter; here the ABI, memory and lifecycle around it are.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/benchtable"
	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/rules"
)

// fakeBridge decides checks with exact fixed-window counts per key, all or
// nothing, like the real bridge, and grants leases as it does (a
// renewal at cost 0, a return gives units back); it can also be told to
// misbehave.
type fakeBridge struct {
	mu       sync.Mutex
	counts   map[string]int64
	next     map[string]int64 // throttle limits: a key's next free slot, unix ms
	held     [][2]int64       // throttle limits: slot and delay given to each request passed
	grants   atomic.Int64     // leases granted
	renewals atomic.Int64     // renewals answered (counted after their grants)
	calls    atomic.Int64
	delay    time.Duration
	status   int    // non-200 answers
	raw      string // a raw body instead of a decision
	// charged, when set, gets the units each fill limit of a check took
	// (a charge after a response), once they are counted.
	charged chan int64
}

func (b *fakeBridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if b.delay > 0 {
		time.Sleep(b.delay)
	}
	if b.status != 0 {
		w.WriteHeader(b.status)
		return
	}
	if b.raw != "" {
		io.WriteString(w, b.raw)
		return
	}
	req, err := rules.DecodeCheckRequest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now().UnixMilli()
	if len(req.Limits) == 1 && req.Limits[0].Throttle {
		w.Write(rules.AppendCheckResponse(nil, b.throttle(&req.Limits[0], now)))
		return
	}
	resp := rules.CheckResponse{Allowed: true, NowMS: now}
	for i := range req.Limits {
		l := &req.Limits[i]
		b.counts[l.Key] -= l.Return.Units
		if req.Op == rules.OpRenew {
			l.Spec.Cost = 0
		}
	}
	for _, l := range req.Limits {
		n := b.counts[l.Key]
		d := rules.Decision{Allowed: n+l.Spec.Cost <= l.Spec.Limit, Limit: l.Spec.Limit, ResetMS: now + l.Spec.WindowMS}
		if l.Fill {
			// It allows while it has anything left, and says what it had.
			d.Allowed, d.Remaining = n < l.Spec.Limit, max(l.Spec.Limit-n, 0)
		}
		if d.Allowed && !l.Fill {
			d.Remaining = l.Spec.Limit - n - l.Spec.Cost
		} else if !d.Allowed {
			d.RetryAfterMS = l.Spec.WindowMS
			if !l.LogOnly {
				resp.Allowed = false
			}
		}
		resp.Decisions = append(resp.Decisions, d)
	}
	if resp.Allowed && req.Op != rules.OpReturn {
		for i, l := range req.Limits {
			d := &resp.Decisions[i]
			if d.Allowed && l.Fill {
				taken := min(l.Spec.Cost, d.Remaining)
				b.counts[l.Key] += taken
				if b.charged != nil && l.Spec.Cost > 0 {
					b.charged <- taken
				}
				continue
			}
			if d.Allowed {
				b.counts[l.Key] += l.Spec.Cost
				if g := min(l.Spec.Lease.Size, d.Remaining); g >= max(1, l.Spec.Cost) {
					b.counts[l.Key] += g
					d.Remaining -= g
					d.Lease = rules.LeaseGrant{Units: g, TTLMS: l.Spec.Lease.TTLMS, Tag: 1}
					b.grants.Add(1)
				}
			}
		}
	}
	if req.Op == rules.OpRenew {
		b.renewals.Add(1)
	}
	w.Write(rules.AppendCheckResponse(nil, &resp))
}

// throttle decides a check of one throttle limit as a token bucket of
// burst 1 would: one slot every window/limit, reserved when it fits in
// max_delay_ms.
func (b *fakeBridge) throttle(l *rules.LimitRequest, now int64) *rules.CheckResponse {
	slot := max(now, b.next[l.Key])
	d := rules.Decision{Allowed: true, Limit: l.Spec.Limit, ResetMS: slot + l.Spec.WindowMS}
	if wait := slot - now; wait > l.MaxDelayMS {
		d.Allowed, d.RetryAfterMS = false, wait-l.MaxDelayMS
		return &rules.CheckResponse{NowMS: now, Decisions: []rules.Decision{d}}
	}
	if b.next == nil {
		b.next = map[string]int64{}
	}
	b.next[l.Key] = slot + l.Spec.WindowMS/l.Spec.Limit
	b.held = append(b.held, [2]int64{slot, slot - now})
	return &rules.CheckResponse{Allowed: true, NowMS: now, DelayMS: slot - now, Decisions: []rules.Decision{d}}
}

const wasmConfig = `{
  "failure_mode": "%MODE%",
  "bridge": {"cluster": "%CLUSTER%", "timeout": "100ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
  "rules": [
    {"name": "api", "match": {"paths": ["/api/**"]}, "limit": 3, "window": "1m", "algorithm": "fixed_window"},
    {"name": "log-only", "match": {"paths": ["/api/search"]}, "limit": 1, "window": "1m", "action": "log_only"},
    {"name": "hot", "match": {"paths": ["/hot/**"]}, "scope": "global", "limit": 1099511627776, "window": "1h",
     "algorithm": "fixed_window", "lease": {"size": 1000000000, "ttl": "1m"}},
    {"name": "charged", "match": {"paths": ["/charged/**"]}, "limit": 1099511627776, "window": "1h",
     "algorithm": "fixed_window", "on_response": {"cost_header": "x-cost"}},
    {"name": "charged-body", "match": {"paths": ["/charged-body/**"]}, "limit": 1099511627776, "window": "1h",
     "algorithm": "fixed_window", "on_response": {"cost_body": "usage.total_tokens"}}
  ],
  "exemptions": {"users": ["ops"]}
}`

// benchConfig is wasmConfig for benchmarks: fail_open, and a limit no
// benchmark reaches, so that the call-out path stays the allowed path.
var benchConfig = strings.NewReplacer("%MODE%", "fail_open", "%CLUSTER%", "bridge", "\"limit\": 3,", "\"limit\": 1000000000,").Replace(wasmConfig)

// benchPaths are the requests both engines' benchmarks measure: (a) no
// rule matches, (b) an over-limit cache hit (mallory is over the limit at
// the bridge, and one request before the benchmark caches it), (c) the
// call-out path, (d) a lease hit (the first request's lease outlasts the
// run). The disabled baseline runs (c) under {"enabled":false}. label
// names each in make bench's table.
var benchPaths = []benchPath{
	{name: "a-no-match", path: "/health", user: "alice", label: "no limit matches"},
	{name: "b-cache-hit", path: "/api/x", user: "mallory", label: "refused from the over-limit cache"},
	{name: "c-call-out", path: "/api/x", user: "alice", label: "a call-out"},
	{name: "d-lease-hit", path: "/hot/x", user: "alice", label: "allowed from a lease"},
}

// benchPath is a request the benchmarks measure: its user by x-user-id,
// or, with jwt, by a bearer token (jwtBenchConfig).
type benchPath struct {
	name, path, user, label string
	jwt                     bool
	// clients, above 0: each request from the next of that many users in
	// turn, as a proxy's clients interleave (user unused).
	clients int
}

// jwtPaths are (b) and (c) for clients identified by a JWT, both engines'.
var jwtPaths = []benchPath{
	{name: "f-cache-hit-jwt", path: "/api/x", user: "mallory", label: "refused from the over-limit cache, a client identified by a JWT", jwt: true},
	{name: "g-call-out-jwt", path: "/api/x", user: "alice", label: "a call-out, a client identified by a JWT", jwt: true},
}

// wazeroPaths are the paths BenchmarkWasm measures: benchPaths, the
// call-out path of a client the VM's plan cache does not hold, a new
// x-user-id for each request (user ""), and of 100 clients in turn,
// which V8's bench host, repeating one request, cannot run, and jwtPaths.
var wazeroPaths = slices.Concat(benchPaths,
	[]benchPath{
		{name: "e-call-out-new-client", path: "/api/x", label: "a call-out, each request a new client"},
		{name: "h-call-out-100-clients", path: "/api/x", label: "a call-out, 100 clients in turn", clients: 100},
	}, jwtPaths)

// jwtBenchSecret signs the benchmarks' tokens (HS256), which expire in
// 2100: jwtBenchConfig's identity.
const jwtBenchSecret = "sluice-bench-jwt-secret-0123456789"

// jwtBenchConfig is benchConfig with users identified by a verified JWT.
var jwtBenchConfig = strings.Replace(benchConfig, `"sources": [{"type": "header", "header": "x-user-id"}]`,
	`"sources": [{"type": "jwt", "keys": [{"alg": "HS256", "secret": "`+jwtBenchSecret+`"}]}]`, 1)

// jwtBenchToken is a bearer token of user for jwtBenchConfig.
func jwtBenchToken(user string) string {
	return "Bearer " + jwttest.HS256(jwtBenchSecret, `{"sub":"`+user+`","exp":4102444800}`)
}

// guestRounds is how many rounds a path's guest time is measured in, each
// followed by a round of the disabled baseline.
const guestRounds = 5

// aboveBaseline measures the plugin's own cost on a path: b.N requests of
// it in guestRounds rounds, each followed (timer stopped) by as many
// requests of the disabled baseline, so that the machine's drift during
// the run, which single runs show as ±300 ns, reaches both alike. path and
// baseline run n requests and return their guest ns per request. above is
// the median of the rounds' differences; guest and base are the path's
// and the baseline's guest ns per request over all their rounds.
func aboveBaseline(b *testing.B, path, baseline func(n int) float64) (above, guest, base float64) {
	type round struct{ path, base float64 }
	rounds := make([]round, 0, guestRounds)
	b.ResetTimer()
	for r := range guestRounds {
		n := b.N / guestRounds
		if r < b.N%guestRounds {
			n++
		}
		if n == 0 {
			continue
		}
		p := path(n)
		b.StopTimer()
		rounds = append(rounds, round{p, baseline(n)})
		guest += p * float64(n)
		base += rounds[len(rounds)-1].base * float64(n)
		b.StartTimer()
	}
	above = benchtable.Median(rounds, func(r round) float64 { return r.path - r.base })
	return above, guest / float64(b.N), base / float64(b.N)
}

// reportGuest reports a path's figures from aboveBaseline.
func reportGuest(b *testing.B, above, guest, base float64) {
	b.ReportMetric(guest, "guest-ns/op")
	b.ReportMetric(base, "baseline-ns/op")
	b.ReportMetric(above, "above-baseline-ns/op")
}

// appendGuestRows adds the plugin's own cost per path on engine to make
// bench's table: above maps a path's name to its guest ns per request
// above the disabled baseline (aboveBaseline).
func appendGuestRows(b *testing.B, engine string, above map[string]float64) {
	var rows []benchtable.Row
	for _, p := range wazeroPaths {
		if _, ok := above[p.name]; !ok {
			continue // a path only wazero's host runs
		}
		rows = append(rows, benchtable.Row{
			Group:   fmt.Sprintf("The plugin's own code per request: guest ns above the disabled baseline, median of %d rounds that alternate the two (targets: no match < 1,000, cache hit < 2,000)", guestRounds),
			Name:    p.label + ", " + engine,
			Metrics: []benchtable.Metric{{Name: "guest ns/request", Value: above[p.name]}},
		})
	}
	if err := benchtable.Append(rows...); err != nil {
		b.Fatal(err)
	}
}

// overLimitKey is mallory's counter at the bridge for rule "api".
const overLimitKey = "rl:{u:mallory}:api"

// engineSetup describes the proxy a scenario needs.
type engineSetup struct {
	mode    string // failure_mode of wasmConfig: fail_open or fail_closed
	cluster string // the cluster wasmConfig names, default "bridge"
	timeout string // the bridge timeout of wasmConfig, default "2s"
	config  string // a whole plugin configuration instead of wasmConfig
	env     map[string]string
	workers int // default 2
	// onLog sees every log entry: its level (proxy-wasm's, 5 is critical)
	// and message.
	onLog func(level int, msg string)
}

func (s engineSetup) pluginConfig() string {
	if s.config != "" {
		return s.config
	}
	cluster, timeout := s.cluster, s.timeout
	if cluster == "" {
		cluster = "bridge"
	}
	if timeout == "" {
		// Long: a call-out a loaded machine (make test runs the fuzzers
		// beside) holds past the timeout fails open, and a scenario's
		// counts come out one short. The failure-mode scenario sets its
		// own.
		timeout = "2s"
	}
	return strings.NewReplacer("%MODE%", s.mode, "%CLUSTER%", cluster, `"100ms"`, `"`+timeout+`"`).Replace(wasmConfig)
}

func (s engineSetup) workerCount() int {
	if s.workers == 0 {
		return 2
	}
	return s.workers
}

// engine is a proxy running the built plugin.
type engine interface {
	// do runs one request for path from 198.51.100.7 with request id
	// rid-1; when the plugin lets it through, the upstream answers
	// upstreamStatus, with the headers named "upstream:<name>" in
	// headers and the body "upstream-body" (splitHeaders).
	do(path string, headers map[string]string, upstreamStatus int) outcome
	metric(name string) int64
	logs() []string
	// failures counts the VMs that failed (trapped) so far.
	failures() int64
}

// splitHeaders splits the headers of engine.do into the request's and the
// upstream response's: a name "upstream:x" is the response's header x,
// and "upstream-body" its body, parts separated by "|" ("upstream-cut":
// the body stops without the end of the stream). The response has a
// content type besides, text/plain unless given.
func splitHeaders(headers map[string]string) (request, upstream [][2]string, body []string) {
	if _, ok := headers["upstream:content-type"]; !ok {
		upstream = [][2]string{{"content-type", "text/plain"}}
	}
	for k, v := range headers {
		switch name, ok := strings.CutPrefix(k, "upstream:"); {
		case ok:
			upstream = append(upstream, [2]string{name, v})
		case k == "upstream-body":
			body = strings.Split(v, "|")
		case k == "upstream-cut":
		default:
			request = append(request, [2]string{k, v})
		}
	}
	return request, upstream, body
}

// startEngine starts a proxy for s whose cluster "bridge" is bridgeURL.
// An error is the proxy refusing the plugin (at load, start or configure).
type startEngine func(t *testing.T, s engineSetup, bridgeURL string) (engine, error)

type outcome struct {
	status  int
	headers map[string]string
	body    string
	vm      int // the worker VM that ran the request; -1 when the engine does not say
}

// proxy is a started engine and its fake bridge.
type proxy struct {
	engine
	bridge *fakeBridge
}

func newBridge(t testing.TB) (*fakeBridge, string) {
	b := &fakeBridge{counts: map[string]int64{}}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	return b, srv.URL
}

func startProxy(t *testing.T, start startEngine, s engineSetup) *proxy {
	t.Helper()
	b, url := newBridge(t)
	e, err := start(t, s, url)
	if err != nil {
		t.Fatal(err)
	}
	return &proxy{engine: e, bridge: b}
}

// logSink collects log entries from an engine's callback.
type logSink struct {
	mu      sync.Mutex
	entries []string
	levels  []int
}

func (l *logSink) add(level int, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, msg)
	l.levels = append(l.levels, level)
}

// at returns the messages logged at level, joined.
func (l *logSink) at(level int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, m := range l.entries {
		if l.levels[i] == level {
			b.WriteString(m)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func (l *logSink) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.entries, "\n")
}

const logCritical = 5

// Allowed requests carry the limit headers; the 4th request is denied
// with the 429 and its headers; both worker VMs then refuse from the
// shared over-limit cache without a call-out; other users, unmatched paths
// and exempt users are unaffected.
func scenarioLimitHeadersAndDenial(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{mode: "fail_open"})
	alice := map[string]string{"x-user-id": "alice"}
	for i, upstream := range []int{200, 404, 503} { // headers on every status that passed
		o := h.do("/api/items", alice, upstream)
		if o.status != upstream || o.headers["x-ratelimit-limit"] != "3" || o.headers["x-ratelimit-remaining"] != fmt.Sprint(2-i) || o.headers["x-ratelimit-reset"] == "" {
			t.Fatalf("request %d: %+v", i+1, o)
		}
	}
	o := h.do("/api/items", alice, 200)
	if o.status != 429 || o.headers["retry-after"] != "60" || o.headers["x-ratelimit-remaining"] != "0" ||
		!strings.Contains(o.body, `"code":"RATE_LIMITED"`) || !strings.Contains(o.body, `"request_id":"rid-1"`) {
		t.Fatalf("4th request: %+v", o)
	}
	// The bridge's refusal is an event with who was refused; the client
	// address is worked out in the answer's callback, the request still
	// paused.
	var refusal string
	for _, m := range h.logs() {
		if strings.Contains(m, `"event_type":"blocked"`) && !strings.Contains(m, "local_cache") {
			refusal = m
		}
	}
	if !strings.Contains(refusal, `"user_id":"alice"`) || !strings.Contains(refusal, `"ip_address":"198.51.100.7"`) {
		t.Errorf("blocked event: %q", refusal)
	}
	// Both worker VMs now answer from the shared over-limit cache, without
	// a call-out: the one the bridge denied on, and the other.
	calls := h.bridge.calls.Load()
	refusedOn := map[int]bool{}
	for i := 0; i < 4; i++ {
		c := h.do("/api/items", alice, 200)
		if c.status != 429 || c.headers["retry-after"] == "" {
			t.Fatalf("cached denial %d: %+v", i, c)
		}
		refusedOn[c.vm] = true
	}
	if got := h.bridge.calls.Load(); got != calls {
		t.Errorf("cached denials made %d call-outs", got-calls)
	}
	if o.vm >= 0 && (len(refusedOn) != 2 || !refusedOn[1-o.vm]) {
		t.Errorf("the bridge denied on VM %d; cached denials came from VMs %v, want both", o.vm, refusedOn)
	}
	if h.metric("sluice_local_cache_hits_total") != 4 || h.metric("sluice_denied_total") != 5 || h.metric("sluice_allowed_total") != 3 {
		t.Errorf("metrics: hits %d denied %d allowed %d", h.metric("sluice_local_cache_hits_total"), h.metric("sluice_denied_total"), h.metric("sluice_allowed_total"))
	}
	// Another user is unaffected; unmatched paths and exempt users never call out.
	if o := h.do("/api/items", map[string]string{"x-user-id": "bob"}, 200); o.status != 200 {
		t.Errorf("bob: %+v", o)
	}
	calls = h.bridge.calls.Load()
	if o := h.do("/health", alice, 200); o.status != 200 || o.headers["x-ratelimit-limit"] != "" {
		t.Errorf("unmatched: %+v", o)
	}
	h.do("/api/items", map[string]string{"x-user-id": "ops"}, 200)
	if h.bridge.calls.Load() != calls {
		t.Error("unmatched or exempt request made a call-out")
	}
	var blocked bool
	for _, m := range h.logs() {
		if strings.Contains(m, `"event_type":"blocked"`) && strings.Contains(m, `"user_id":"alice"`) {
			blocked = true
		}
	}
	if !blocked {
		t.Error("no blocked event logged")
	}
	if n := h.failures(); n != 0 {
		t.Errorf("%d VM failures", n)
	}
}

// A client refused again and again: after its first refusals of a second,
// a VM answers from its plan cache and counts those refusals at its next
// tick, in requests, denied and local cache hits at once. The counters
// add up whenever they are read, and count every refusal within a tick.
func scenarioRefusalsCounted(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{mode: "fail_open"})
	carol := map[string]string{"x-user-id": "carol"}
	const allowed, denied = 3, 20 // the first denial is the bridge's, the rest the cache's
	for i := range allowed + denied {
		want := 200
		if i >= allowed {
			want = 429
		}
		if o := h.do("/api/items", carol, 200); o.status != want {
			t.Fatalf("request %d: %+v, want %d", i+1, o, want)
		}
	}
	counts := func() [4]int64 {
		return [4]int64{h.metric("sluice_requests_total"), h.metric("sluice_allowed_total"),
			h.metric("sluice_denied_total"), h.metric("sluice_local_cache_hits_total")}
	}
	if c := counts(); c[0] != c[1]+c[2] || c[2]-c[3] != 1 {
		t.Errorf("requests, allowed, denied, cache hits %v: requests are not allowed + denied, or denied not the bridge's one + cache hits", c)
	}
	// The hosts' ticks run on their own clock, once a second here.
	want := [4]int64{allowed + denied, allowed, denied, denied - 1}
	for end := time.Now().Add(5 * time.Second); counts() != want && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if c := counts(); c != want {
		t.Errorf("requests, allowed, denied, cache hits %v, want %v", c, want)
	}
	if n := h.failures(); n != 0 {
		t.Errorf("%d VM failures", n)
	}
}

// A leased limit: its first request gets a lease, which the next ones
// spend from the shared data of both worker VMs without a call-out (a
// renewal goes out in the background at half of it); no more than the
// limit passes, none twice from one unit. Each request is sent once
// every renewal the proxy sent was answered and the grants the bridge
// made have reached the proxy: how many requests a renewal still on its
// way sends to the bridge depends on the machine's load, which this
// scenario does not measure.
func scenarioLease(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{config: `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "bridge", "timeout": "2s"},
  "rules": [{"name": "hot", "match": {"paths": ["/hot/**"]}, "scope": "global", "limit": 60, "window": "1h",
             "algorithm": "fixed_window", "lease": {"size": 10, "ttl": "1m"}}]
}`})
	vms := map[int]bool{}
	passed := 0
	for range 70 {
		o := h.do("/hot/x", nil, 200)
		if o.status == 200 {
			passed++
			if o.headers["x-ratelimit-limit"] != "60" {
				t.Fatalf("headers: %+v", o)
			}
		}
		vms[o.vm] = true
		deadline := time.Now().Add(5 * time.Second)
		// Renewals first: the bridge counts one after its grant.
		for h.bridge.renewals.Load() < h.metric("sluice_lease_renewals_total") || h.metric("sluice_lease_grants_total") < h.bridge.grants.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("%d renewals answered of %d sent, %d grants received of %d sent", h.bridge.renewals.Load(), h.metric("sluice_lease_renewals_total"),
					h.metric("sluice_lease_grants_total"), h.bridge.grants.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The limit exactly: no renewal is on its way at the end.
	if passed != 60 {
		t.Errorf("%d passed a limit of 60", passed)
	}
	// The first request and the first denial call out, and each lease's
	// renewal; the rest are answered in the proxy.
	hits, calls := h.metric("sluice_lease_hits_total"), h.bridge.calls.Load()
	if hits < 55 || calls > 15 {
		t.Errorf("%d answered from leases, %d call-outs for 70 requests", hits, calls)
	}
	if h.metric("sluice_lease_units_spent_total") != hits {
		t.Errorf("units spent %d, lease hits %d", h.metric("sluice_lease_units_spent_total"), hits)
	}
	if n := h.failures(); n != 0 {
		t.Errorf("%d VM failures", n)
	}
	t.Logf("70 requests: %d passed, %d from leases, %d call-outs, VMs %v", passed, hits, calls, vms)
}

// A throttle limit of 10 a second (a slot every 100 ms) that may hold a
// request for 1 s: a burst of 16 requests at once, on both worker VMs,
// passes one every 100 ms, each no earlier than its slot, and says how
// long it waited; those whose slot is more than a second away get 429 at
// once.
func scenarioThrottle(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{config: `{
  "bridge": {"cluster": "bridge", "timeout": "1s"},
  "rules": [{"name": "hooks", "match": {"paths": ["/hooks/**"]}, "scope": "global", "limit": 10, "window": "1s",
             "algorithm": "fixed_window", "action": "throttle", "max_delay": "1s"}]
}`})
	type result struct {
		o        outcome
		took     time.Duration
		doneAt   time.Time
		delayHdr string
	}
	const n = 16
	results := make([]result, n)
	begin := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			o := h.do("/hooks/in", nil, 200)
			results[i] = result{o: o, took: time.Since(begin), doneAt: time.Now(), delayHdr: o.headers["x-ratelimit-delay"]}
		})
	}
	wg.Wait()
	var passed, refused []result
	for _, r := range results {
		switch r.o.status {
		case 200:
			passed = append(passed, r)
		case 429:
			refused = append(refused, r)
		default:
			t.Fatalf("status %d: %+v", r.o.status, r.o)
		}
	}
	// Slots 0, 100, ..., 1000 ms fit in the 1 s max_delay: 11 pass.
	if len(passed) != 11 || len(refused) != n-11 {
		t.Fatalf("%d passed, %d refused; want 11 and 5", len(passed), len(refused))
	}
	for _, r := range refused {
		if r.took > 500*time.Millisecond {
			t.Errorf("a refusal took %v: it must not wait", r.took)
		}
	}
	// Each passed no earlier than the delay it reports, which is the one
	// the bridge gave it; the bridge gave the slots 0, 100, ..., 1000 ms
	// from the first (each request's delay is its slot less when it
	// reached the bridge).
	var delays, given []int64
	for _, r := range passed {
		var d int64
		if r.delayHdr != "" {
			fmt.Sscan(r.delayHdr, &d)
		}
		if r.took < time.Duration(d)*time.Millisecond {
			t.Errorf("passed after %v, before its delay of %d ms", r.took, d)
		}
		delays = append(delays, d)
	}
	h.bridge.mu.Lock()
	held := slices.Clone(h.bridge.held)
	h.bridge.mu.Unlock()
	slices.SortFunc(held, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	for i, sd := range held {
		if sd[0] != held[0][0]+100*int64(i) {
			t.Errorf("slots %v: want one every 100 ms", held)
			break
		}
		given = append(given, sd[1])
	}
	slices.Sort(delays)
	slices.Sort(given)
	if !slices.Equal(delays, given) {
		t.Errorf("delays on the answers %v, given by the bridge %v", delays, given)
	}
	// The first of the refused is the bridge's; the others are too, or
	// the local cache's when they came after it.
	tooLong, hits := h.metric("sluice_throttle_too_long_total"), h.metric("sluice_local_cache_hits_total")
	if h.metric("sluice_throttled_total") != 10 || tooLong < 1 || tooLong+hits != 5 || h.metric("sluice_throttle_waiting") != 0 {
		t.Errorf("metrics: throttled %d too long %d cache hits %d waiting %d", h.metric("sluice_throttled_total"),
			tooLong, hits, h.metric("sluice_throttle_waiting"))
	}
	if n := h.failures(); n != 0 {
		t.Errorf("%d VM failures", n)
	}
}

func scenarioLogOnly(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{mode: "fail_open"})
	u := map[string]string{"x-user-id": "carol"}
	h.do("/api/search", u, 200)
	if o := h.do("/api/search", u, 200); o.status != 200 {
		t.Fatalf("log_only denial must pass: %+v", o)
	}
	if h.metric("sluice_log_only_denied_total") != 1 {
		t.Errorf("log_only denials: %d", h.metric("sluice_log_only_denied_total"))
	}
}

// A rule on a query parameter limits the requests whose query has it,
// however it is encoded, and no other; the user is a query parameter too.
// The third CSV export is refused by the bridge, the next ones from the
// over-limit cache (one VM's plan cache keyed on the whole path, the
// other's evaluation of its own), the user's id encoded or not; another
// user's export passes, and so does a TSV or JSON export of the same path.
func scenarioQueryMatch(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{config: `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "bridge", "timeout": "2s"},
  "identity": {"sources": [{"type": "query", "param": "user"}]},
  "rules": [{"name": "csv", "match": {"paths": ["/reports/**"], "query": [{"name": "format", "equals": "csv"}]},
             "limit": 2, "window": "1h", "algorithm": "fixed_window"}]
}`})
	for i, want := range []int{200, 200, 429} {
		if o := h.do("/reports/7?format=csv&user=dana", nil, 200); o.status != want {
			t.Fatalf("CSV export %d: %+v, want %d", i+1, o, want)
		}
	}
	calls := h.bridge.calls.Load()
	for _, path := range []string{"/reports/7?format=csv&user=dana", "/reports/7?format=c%73v&user=d%61na",
		"/reports/7?page=2&format=json&user=dana&format=csv", "/reports/7?user=dana&format=csv"} {
		if o := h.do(path, nil, 200); o.status != 429 || o.headers["retry-after"] == "" {
			t.Errorf("%s: %+v, want a 429 from the cache", path, o)
		}
	}
	if got := h.bridge.calls.Load(); got != calls {
		t.Errorf("refusals from the cache made %d call-outs", got-calls)
	}
	if o := h.do("/reports/7?format=csv&user=erin", nil, 200); o.status != 200 || o.headers["x-ratelimit-limit"] != "2" {
		t.Errorf("another user's CSV export: %+v, want 200 with its limit", o)
	}
	// A TSV export's path has the CSV one's length and last byte, which
	// pick a plan's slot in the plan cache.
	for _, path := range []string{"/reports/7?format=tsv&user=dana", "/reports/7?format=json&user=dana", "/reports/7?user=dana", "/reports/7?format=csvx&user=dana"} {
		if o := h.do(path, nil, 200); o.status != 200 || o.headers["x-ratelimit-limit"] != "" {
			t.Errorf("%s: %+v, want 200 without a limit", path, o)
		}
	}
	if n := h.failures(); n != 0 {
		t.Errorf("%d VM failures", n)
	}
}

// Limits charged after the response: a token budget charged by the
// upstream's usage header, failed logins, and a token budget charged by
// the usage in a language model's answer. A request passes while its
// budget has anything left and is charged what its response says, capped
// at what is left; once nothing is, requests are refused, then from the
// over-limit cache. A login is charged only when it fails.
func scenarioChargeOnResponse(t *testing.T, start startEngine) {
	h := startProxy(t, start, engineSetup{config: `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "bridge", "timeout": "2s"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [
    {"name": "tokens", "match": {"paths": ["/v1/**"]}, "limit": 100, "window": "1h", "algorithm": "fixed_window",
     "on_response": {"statuses": ["2xx"], "cost_header": "x-usage-tokens"}},
    {"name": "logins", "match": {"paths": ["/login"]}, "scope": "ip", "limit": 2, "window": "1h", "algorithm": "fixed_window",
     "on_response": {"statuses": [401]}},
    {"name": "llm", "match": {"paths": ["/llm/**"]}, "limit": 50, "window": "1h", "algorithm": "fixed_window",
     "on_response": {"statuses": ["2xx"], "cost_body": "usage.total_tokens"}}]
}`})
	h.bridge.mu.Lock()
	h.bridge.charged = make(chan int64, 16)
	h.bridge.mu.Unlock()
	charged := func(want int64) {
		t.Helper()
		select {
		case got := <-h.bridge.charged:
			if got != want {
				t.Fatalf("charged %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no charge of %d", want)
		}
	}
	dana := func(tokens string) map[string]string {
		return map[string]string{"x-user-id": "dana", "upstream:x-usage-tokens": tokens}
	}
	if o := h.do("/v1/chat", dana("60"), 200); o.status != 200 || o.headers["x-ratelimit-remaining"] != "100" {
		t.Fatalf("first request: %+v, want 200 with all 100 left", o)
	}
	charged(60)
	if o := h.do("/v1/chat", dana("60"), 200); o.status != 200 || o.headers["x-ratelimit-remaining"] != "40" {
		t.Fatalf("second request: %+v, want 200 with 40 left", o)
	}
	charged(40) // what was left
	if o := h.do("/v1/chat", dana("1"), 200); o.status != 429 || o.headers["retry-after"] == "" {
		t.Fatalf("spent budget: %+v, want 429", o)
	}
	calls := h.bridge.calls.Load()
	if o := h.do("/v1/chat", dana("1"), 200); o.status != 429 || h.bridge.calls.Load() != calls {
		t.Errorf("spent budget again: %+v and %d call-outs, want 429 from the cache", o, h.bridge.calls.Load()-calls)
	}
	if o := h.do("/v1/chat", map[string]string{"x-user-id": "erin", "upstream:x-usage-tokens": "5"}, 200); o.status != 200 {
		t.Errorf("another user: %+v", o)
	}
	charged(5)

	charges := h.metric("sluice_charges_total")
	if o := h.do("/login", nil, 200); o.status != 200 || h.metric("sluice_charges_total") != charges {
		t.Errorf("a login that succeeds: %+v, %d charges", o, h.metric("sluice_charges_total")-charges)
	}
	for i := range 2 {
		if o := h.do("/login", nil, 401); o.status != 401 {
			t.Fatalf("failed login %d: %+v", i+1, o)
		}
		charged(1)
	}
	if o := h.do("/login", nil, 200); o.status != 429 {
		t.Errorf("a login after two failures: %+v, want 429", o)
	}

	// A language model's answer says what it cost in its body: as JSON,
	// or in the last data line of an event stream.
	json := map[string]string{"x-user-id": "dana", "upstream:content-type": "application/json",
		"upstream-body": `{"choices":[{"message":{"content":"\"usage\":{\"total_tokens\":1}"}}],|"usage":{"total_tokens":30}}`}
	if o := h.do("/llm/chat", json, 200); o.status != 200 {
		t.Fatalf("a JSON answer: %+v", o)
	}
	charged(30)
	stream := map[string]string{"x-user-id": "dana", "upstream:content-type": "text/event-stream",
		"upstream-body": "data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_to|kens\":15}}\n\n|data: [DONE]\n\n"}
	if o := h.do("/llm/chat", stream, 200); o.status != 200 {
		t.Fatalf("a streamed answer: %+v", o)
	}
	charged(15)
	if o := h.do("/llm/chat", stream, 200); o.status != 200 || o.headers["x-ratelimit-remaining"] != "5" {
		t.Fatalf("with 5 left: %+v", o)
	}
	charged(5) // what was left
	if o := h.do("/llm/chat", json, 200); o.status != 429 {
		t.Errorf("a spent budget: %+v, want 429", o)
	}
	// An answer cut short after its usage is charged when its stream ends.
	cut := map[string]string{"x-user-id": "erin", "upstream:content-type": "application/json", "upstream-cut": "1",
		"upstream-body": `{"usage":{"total_tokens":12},|"choices":[`}
	if o := h.do("/llm/chat", cut, 200); o.status != 200 {
		t.Fatalf("an answer cut short: %+v", o)
	}
	charged(12)
	if n := h.metric("sluice_charge_errors_total"); n != 0 || h.failures() != 0 {
		t.Errorf("%d charge errors, %d VM failures", n, h.failures())
	}
}

// A bridge that times out, fails, talks nonsense or is not a cluster
// passes the request under fail_open and answers 503 under fail_closed,
// within the call-out timeout.
func scenarioFailureModes(t *testing.T, start startEngine) {
	cases := []struct {
		name    string
		cluster string
		setup   func(*fakeBridge)
	}{
		{"timeout", "bridge", func(b *fakeBridge) { b.delay = 400 * time.Millisecond }},
		{"status 500", "bridge", func(b *fakeBridge) { b.status = 500 }},
		{"garbage", "bridge", func(b *fakeBridge) { b.raw = "not json" }},
		{"unknown cluster", "nowhere", func(*fakeBridge) {}},
	}
	for _, mode := range []string{"fail_open", "fail_closed"} {
		for _, tc := range cases {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				h := startProxy(t, start, engineSetup{mode: mode, cluster: tc.cluster, timeout: "100ms"})
				tc.setup(h.bridge)
				begin := time.Now()
				o := h.do("/api/items", map[string]string{"x-user-id": "dave"}, 200)
				took := time.Since(begin)
				if took > 100*time.Millisecond+250*time.Millisecond {
					t.Errorf("answer took %v; the call-out timeout is 100ms", took)
				}
				if mode == "fail_open" && o.status != 200 {
					t.Errorf("fail_open: %+v", o)
				}
				if mode == "fail_closed" && (o.status != 503 || !strings.Contains(o.body, "SERVICE_UNAVAILABLE")) {
					t.Errorf("fail_closed: %+v", o)
				}
				if h.metric("sluice_bridge_errors_total") != 1 {
					t.Errorf("bridge errors: %d", h.metric("sluice_bridge_errors_total"))
				}
			})
		}
	}
}

// The built plugin reads its category defaults from the VM's environment
// (Envoy's vm_config.environment_variables), and refuses a bad value by
// the variable's name.
func scenarioEnvironment(t *testing.T, start startEngine) {
	const cfg = `{"bridge": {"cluster": "bridge"}, "categories": [{"name": "chat", "paths": ["/chat"], "algorithm": "fixed_window"}]}`
	h := startProxy(t, start, engineSetup{config: cfg, env: map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "2", "RATE_LIMIT_CHAT_WINDOW": "90"}})
	u := map[string]string{"x-forwarded-for": "192.0.2.1"}
	for i, want := range []int{200, 200, 429} {
		if o := h.do("/chat", u, 200); o.status != want || o.headers["x-ratelimit-limit"] != "2" {
			t.Fatalf("request %d: %+v, want %d with limit 2", i+1, o, want)
		}
	}

	var logs logSink
	_, url := newBridge(t)
	if _, err := start(t, engineSetup{config: cfg, env: map[string]string{"RATE_LIMIT_CHAT_WINDOW": "a while"}, onLog: logs.add}, url); err == nil {
		t.Fatal("a bad RATE_LIMIT_CHAT_WINDOW was accepted")
	}
	if !strings.Contains(logs.all(), `configuration refused: RATE_LIMIT_CHAT_WINDOW: must be`) {
		t.Errorf("the refusal does not name the variable: %q", logs.all())
	}
}

// A configuration the plugin refuses (proxy_on_configure returns false)
// stops the proxy from starting, and the error log names the field.
func scenarioConfigRefused(t *testing.T, start startEngine) {
	var logs logSink
	_, url := newBridge(t)
	if _, err := start(t, engineSetup{config: `{"rules":[{"name":"x","limit":-1,"window":"1s"}]}`, onLog: logs.add}, url); err == nil {
		t.Fatal("an invalid configuration was accepted")
	}
	if got := logs.at(4); !strings.Contains(got, "configuration refused: rules[0].limit") {
		t.Errorf("no error log naming rules[0].limit: %q", got)
	}
}

// A Go panic in the plugin's code is logged with its stack at critical
// level, counted, answers its request by the failure mode, and leaves the
// VM serving (it does not trap). The panics come from the test-only
// trigger: VM env SLUICE_TEST_PANIC=1 plus a request header, "request"
// (in proxy_on_request_headers) or "callout" (while the bridge's answer
// is handled).
func scenarioPanic(t *testing.T, start startEngine) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		for _, where := range []string{"request", "callout"} {
			t.Run(mode+"/"+where, func(t *testing.T) {
				var logs logSink
				// One worker, so that the next request runs on the VM that panicked.
				h := startProxy(t, start, engineSetup{mode: mode, workers: 1,
					env: map[string]string{"SLUICE_TEST_PANIC": "1"}, onLog: logs.add})

				o := h.do("/api/items", map[string]string{"x-user-id": "pat", "x-sluice-test-panic": where}, 200)
				if mode == "fail_open" && o.status != 200 {
					t.Errorf("fail_open: %+v, want the request to pass", o)
				}
				if mode == "fail_closed" && (o.status != 503 || !strings.Contains(o.body, "plugin error")) {
					t.Errorf("fail_closed: %+v, want 503", o)
				}
				if n := h.metric("sluice_panics_total"); n != 1 {
					t.Errorf("sluice_panics_total = %d, want 1", n)
				}
				callback := map[string]string{"request": "proxy_on_request_headers", "callout": "proxy_on_http_call_response"}[where]
				if crit := logs.at(logCritical); !strings.Contains(crit, "panic in "+callback+": sluice: test panic") || !strings.Contains(crit, "goroutine ") {
					t.Errorf("no critical log with the panic and its stack: %q", crit)
				}
				// The same VM serves the next request as usual.
				if o := h.do("/api/items", map[string]string{"x-user-id": "pat"}, 200); o.status != 200 || o.headers["x-ratelimit-limit"] != "3" {
					t.Errorf("next request: %+v", o)
				}
				if n := h.failures(); n != 0 {
					t.Errorf("the VM failed %d times", n)
				}
			})
		}
	}
}
