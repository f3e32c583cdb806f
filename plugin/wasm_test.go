//go:build !wasip1

package main

// These tests run the built plugin (the same build as `make wasm`) in the
// wasmhost proxy-wasm host, with two worker VMs, against an httptest bridge:
// the filter's logic is unit-tested natively in plugin/filter, and here
// the ABI, memory and lifecycle around it are.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

var wasmBytes []byte

func TestMain(m *testing.M) {
	var err error
	if wasmBytes, err = e2etest.BuildPlugin(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// fakeBridge decides checks with exact fixed-window counts per key, all or
// nothing, like the real bridge; it can also be told to misbehave.
type fakeBridge struct {
	mu     sync.Mutex
	counts map[string]int64
	calls  atomic.Int64
	delay  time.Duration
	status int    // non-200 answers
	raw    string // a raw body instead of a decision
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
	resp := rules.CheckResponse{Allowed: true, NowMS: now}
	for _, l := range req.Limits {
		n := b.counts[l.Key]
		d := rules.Decision{Allowed: n+l.Spec.Cost <= l.Spec.Limit, Limit: l.Spec.Limit, ResetMS: now + l.Spec.WindowMS}
		if d.Allowed {
			d.Remaining = l.Spec.Limit - n - l.Spec.Cost
		} else {
			d.RetryAfterMS = l.Spec.WindowMS
			if !l.LogOnly {
				resp.Allowed = false
			}
		}
		resp.Decisions = append(resp.Decisions, d)
	}
	if resp.Allowed {
		for i, l := range req.Limits {
			if resp.Decisions[i].Allowed {
				b.counts[l.Key] += l.Spec.Cost
			}
		}
	}
	w.Write(rules.AppendCheckResponse(nil, &resp))
}

const wasmConfig = `{
  "failure_mode": "%MODE%",
  "bridge": {"cluster": "%CLUSTER%", "timeout": "100ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
  "rules": [
    {"name": "api", "match": {"paths": ["/api/**"]}, "limit": 3, "window": "1m", "algorithm": "fixed_window"},
    {"name": "log-only", "match": {"paths": ["/api/search"]}, "limit": 1, "window": "1m", "action": "log_only"}
  ],
  "exemptions": {"users": ["ops"]}
}`

type harness struct {
	t      *testing.T
	host   *wasmhost.Host
	bridge *fakeBridge
}

func newHarness(t *testing.T, mode, cluster string) *harness {
	return newHarnessTimeout(t, mode, cluster, "100ms")
}

func newHarnessTimeout(t *testing.T, mode, cluster, timeout string) *harness {
	t.Helper()
	b := &fakeBridge{counts: map[string]int64{}}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	cfg := strings.NewReplacer("%MODE%", mode, "%CLUSTER%", cluster, `"100ms"`, `"`+timeout+`"`).Replace(wasmConfig)
	host, err := wasmhost.New(context.Background(), wasmBytes, wasmhost.Options{
		Workers: 2, PluginConfig: []byte(cfg), RootID: "sluice",
		Clusters: map[string]string{"bridge": srv.URL},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	return &harness{t: t, host: host, bridge: b}
}

// The built plugin reads its category defaults from the VM's environment
// (wasmhost.Options.Environment, as Envoy's vm_config.environment_variables),
// and refuses a bad value by the variable's name.
func TestWasm_Environment(t *testing.T) {
	b := &fakeBridge{counts: map[string]int64{}}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	const cfg = `{"bridge": {"cluster": "bridge"}, "categories": [{"name": "chat", "paths": ["/chat"], "algorithm": "fixed_window"}]}`
	opts := wasmhost.Options{
		Workers: 2, PluginConfig: []byte(cfg), RootID: "sluice", Clusters: map[string]string{"bridge": srv.URL},
		Environment: map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "2", "RATE_LIMIT_CHAT_WINDOW": "90"},
	}
	host, err := wasmhost.New(context.Background(), wasmBytes, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	h := &harness{t: t, host: host, bridge: b}
	u := map[string]string{"x-forwarded-for": "192.0.2.1"}
	for i, want := range []int{200, 200, 429} {
		if o := h.do("/chat", u, 200); o.status != want || o.headers["x-ratelimit-limit"] != "2" {
			t.Fatalf("request %d: %+v, want %d with limit 2", i+1, o, want)
		}
	}

	opts.Environment = map[string]string{"RATE_LIMIT_CHAT_WINDOW": "a while"}
	var (
		mu   sync.Mutex
		logs []string
	)
	opts.OnLog = func(e wasmhost.LogEntry) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, e.Message)
	}
	if bad, err := wasmhost.New(context.Background(), wasmBytes, opts); err == nil {
		bad.Close()
		t.Fatal("a bad RATE_LIMIT_CHAT_WINDOW was accepted")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(logs, "\n"), `configuration refused: RATE_LIMIT_CHAT_WINDOW: must be`) {
		t.Errorf("the refusal does not name the variable: %q", logs)
	}
}

type outcome struct {
	status  int
	headers map[string]string
	body    string
}

// do runs one request through the plugin and, when it passes, an upstream
// answer with upstreamStatus back through the response headers.
func (h *harness) do(path string, headers map[string]string, upstreamStatus int) outcome {
	h.t.Helper()
	var hdrs [][2]string
	for k, v := range headers {
		hdrs = append(hdrs, [2]string{k, v})
	}
	ctx := context.Background()
	s := h.host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: path, Host: "api.example.com", Headers: hdrs, SourceAddress: "198.51.100.7:4242", RequestID: "rid-1"})
	defer s.Close()
	res, err := s.RequestHeaders(ctx)
	if err != nil {
		h.t.Fatalf("request headers: %v", err)
	}
	if res.Local != nil {
		m := map[string]string{}
		for _, kv := range res.Local.Headers {
			m[strings.ToLower(kv[0])] = kv[1]
		}
		return outcome{res.Local.Status, m, string(res.Local.Body)}
	}
	out, err := s.ResponseHeaders(ctx, upstreamStatus, [][2]string{{"content-type", "text/plain"}})
	if err != nil {
		h.t.Fatalf("response headers: %v", err)
	}
	m := map[string]string{}
	for _, kv := range out.Headers {
		m[strings.ToLower(kv[0])] = kv[1]
	}
	return outcome{status: upstreamStatus, headers: m}
}

func (h *harness) metric(name string) int64 {
	v, _ := h.host.Metric(name)
	return v
}

func TestWasm_LimitHeadersAndDenial(t *testing.T) {
	h := newHarness(t, "fail_open", "bridge")
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
	// Both worker VMs now answer from the shared over-limit cache, without a call-out.
	calls := h.bridge.calls.Load()
	for i := 0; i < 4; i++ {
		if o := h.do("/api/items", alice, 200); o.status != 429 {
			t.Fatalf("cached denial %d: %+v", i, o)
		}
	}
	if got := h.bridge.calls.Load(); got != calls {
		t.Errorf("cached denials made %d call-outs", got-calls)
	}
	if h.metric("sluice_local_cache_hits_total") != 4 || h.metric("sluice_denied_total") != 5 || h.metric("sluice_allowed_total") != 3 {
		t.Errorf("metrics: hits %d denied %d allowed %d", h.metric("sluice_local_cache_hits_total"), h.metric("sluice_denied_total"), h.metric("sluice_allowed_total"))
	}
	// Another user is unaffected; unmatched paths and exempt users never call out.
	if o := h.do("/api/items", map[string]string{"x-user-id": "bob"}, 200); o.status != 200 {
		t.Errorf("bob: %+v", o)
	}
	calls = h.bridge.calls.Load()
	h.do("/health", alice, 200)
	h.do("/api/items", map[string]string{"x-user-id": "ops"}, 200)
	if h.bridge.calls.Load() != calls {
		t.Error("unmatched or exempt request made a call-out")
	}
	var blocked bool
	for _, e := range h.host.Logs() {
		if strings.Contains(e.Message, `"event_type":"blocked"`) && strings.Contains(e.Message, `"user_id":"alice"`) {
			blocked = true
		}
	}
	if !blocked {
		t.Error("no blocked event logged")
	}
}

func TestWasm_LogOnly(t *testing.T) {
	h := newHarness(t, "fail_open", "bridge")
	u := map[string]string{"x-user-id": "carol"}
	h.do("/api/search", u, 200)
	if o := h.do("/api/search", u, 200); o.status != 200 {
		t.Fatalf("log_only denial must pass: %+v", o)
	}
	if h.metric("sluice_log_only_denied_total") != 1 {
		t.Errorf("log_only denials: %d", h.metric("sluice_log_only_denied_total"))
	}
}

func TestWasm_FailureModes(t *testing.T) {
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
				h := newHarness(t, mode, tc.cluster)
				tc.setup(h.bridge)
				start := time.Now()
				o := h.do("/api/items", map[string]string{"x-user-id": "dave"}, 200)
				took := time.Since(start)
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

func TestWasm_ConfigureRefusedKeepsPrevious(t *testing.T) {
	h := newHarness(t, "fail_open", "bridge")
	err := h.host.Configure(context.Background(), []byte(`{"rules":[{"name":"x","limit":-1,"window":"1s"}]}`))
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	u := map[string]string{"x-user-id": "erin"}
	for i := 0; i < 3; i++ {
		h.do("/api/items", u, 200)
	}
	if o := h.do("/api/items", u, 200); o.status != 429 {
		t.Errorf("previous config not in force: %+v", o)
	}
	var logged bool
	for _, e := range h.host.Logs() {
		logged = logged || strings.Contains(e.Message, "rules[0].limit")
	}
	if !logged {
		t.Error("refusal not logged with its field path")
	}
}

// A hammer: many concurrent requests for a few users over both VMs admit
// exactly the limit per user.
func TestWasm_ConcurrentExact(t *testing.T) {
	// fail_closed and a generous timeout: a slow call-out under load must
	// not turn into an admission here.
	h := newHarnessTimeout(t, "fail_closed", "bridge", "5s")
	var passed [4]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				u := g % 4
				ctx := context.Background()
				s := h.host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: "/api/x", Headers: [][2]string{{"x-user-id", fmt.Sprint("u", u)}}, SourceAddress: "198.51.100.7:1"})
				res, err := s.RequestHeaders(ctx)
				if err == nil && res.Local == nil {
					passed[u].Add(1)
				}
				s.Close()
			}
		}(g)
	}
	wg.Wait()
	if n := h.metric("sluice_bridge_errors_total"); n != 0 {
		t.Fatalf("%d bridge errors", n)
	}
	for u := range passed {
		if got := passed[u].Load(); got != 3 {
			t.Errorf("user %d: %d requests passed, want exactly 3", u, got)
		}
	}
}

// inProcess answers call-outs without a network, for benchmarks.
type inProcess struct{ h http.Handler }

func (p inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	p.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// BenchmarkWasm measures whole requests through the built plugin in the wasmhost
// host (wazero compiler): (a) no rule matches, (b) over-limit cache hit,
// (c) the call-out path with an in-process bridge. cpu-ns/op is the whole
// process (host and guest); guest-ns/op is the plugin's own code, all its
// guest callbacks of the request (host functions excluded).
func BenchmarkWasm(b *testing.B) {
	bridge := &fakeBridge{counts: map[string]int64{}}
	cfg := strings.NewReplacer("%MODE%", "fail_open", "%CLUSTER%", "bridge", "\"limit\": 3,", "\"limit\": 1000000000,").Replace(wasmConfig)
	host, err := wasmhost.New(context.Background(), wasmBytes, wasmhost.Options{
		Workers: 1, PluginConfig: []byte(cfg), RootID: "sluice", MeasureGuest: true,
		Clusters:   map[string]string{"bridge": "http://bridge.invalid"},
		HTTPClient: &http.Client{Transport: inProcess{bridge}},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	ctx := context.Background()
	run := func(b *testing.B, path, user string) {
		info := wasmhost.RequestInfo{Method: "GET", Path: path, Host: "api.example.com", SourceAddress: "198.51.100.7:4242",
			Headers: [][2]string{{"x-user-id", user}, {"x-request-id", "rid"}}}
		b.ReportAllocs()
		cpu, guest := cpuNanos(), host.GuestTime()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s := host.NewStream(ctx, info)
			if _, err := s.RequestHeaders(ctx); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
		b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N), "cpu-ns/op")
		// The filter itself: guest code only, host functions excluded.
		b.ReportMetric(float64(host.GuestTime()-guest)/float64(b.N), "guest-ns/op")
	}
	b.Run("a-no-match", func(b *testing.B) { run(b, "/health", "alice") })
	b.Run("b-cache-hit", func(b *testing.B) {
		bridge.mu.Lock()
		bridge.counts["rl:{u:mallory}:api"] = 1 << 40
		bridge.mu.Unlock()
		s := host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "mallory"}}})
		s.RequestHeaders(ctx)
		s.Close()
		run(b, "/api/x", "mallory")
	})
	b.Run("c-call-out", func(b *testing.B) { run(b, "/api/x", "alice") })
	// The host's own cost per request: the same stream with a disabled
	// config, where the filter returns at once. Path minus baseline is the
	// filter's share (including the host calls it makes).
	if err := host.Configure(ctx, []byte(`{"enabled":false}`)); err != nil {
		b.Fatal(err)
	}
	b.Run("baseline-disabled", func(b *testing.B) { run(b, "/api/x", "alice") })
}

// cpuNanos is the CPU time (user + system) this process has used.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// The guest heap stays flat: after a warm-up, a million requests over the
// no-match, cache-hit and call-out paths leave every VM's linear memory
// the size it was.
func TestWasm_HeapFlat(t *testing.T) {
	bridge := &fakeBridge{counts: map[string]int64{"rl:{u:mallory}:api": 1 << 40}}
	cfg := strings.NewReplacer("%MODE%", "fail_open", "%CLUSTER%", "bridge", "\"limit\": 3,", "\"limit\": 1000000000,").Replace(wasmConfig)
	host, err := wasmhost.New(context.Background(), wasmBytes, wasmhost.Options{
		Workers: 2, PluginConfig: []byte(cfg), RootID: "sluice", LogCapacity: 16,
		Clusters:   map[string]string{"bridge": "http://bridge.invalid"},
		HTTPClient: &http.Client{Transport: inProcess{bridge}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	ctx := context.Background()
	infos := []wasmhost.RequestInfo{
		{Method: "GET", Path: "/health", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
		{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "mallory"}}},
		{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
	}
	run := func(n int) {
		for i := 0; i < n; i++ {
			info := infos[i%2] // no match and cache hit
			if i%50 == 0 {
				info = infos[2] // a call-out now and then
			}
			s := host.NewStream(ctx, info)
			if _, err := s.RequestHeaders(ctx); err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
	}
	run(20_000)
	before := host.MemorySizes()
	run(1_000_000)
	after := host.MemorySizes()
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("VM %d: linear memory grew from %d to %d bytes over 1M requests", i, before[i], after[i])
		}
	}
	t.Logf("linear memory per VM: %v bytes", after)
}
