//go:build !wasip1

package main

// These tests run the built plugin (the same build as `make wasm`) in the
// project's wazero host, wasmhost: the shared scenarios (scenarios_test.go)
// and what only this host offers (reconfiguring, concurrent streams,
// memory sizes, guest time).

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/e2e/e2etest"
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

// wazeroEngine runs the plugin in the project's wazero host (wasmhost).
type wazeroEngine struct {
	t    *testing.T
	host *wasmhost.Host
}

func startWazero(t *testing.T, s engineSetup, bridgeURL string) (engine, error) {
	opts := wasmhost.Options{
		Workers: s.workerCount(), PluginConfig: []byte(s.pluginConfig()), RootID: "sluice",
		Clusters: map[string]string{"bridge": bridgeURL}, Environment: s.env,
		CompilationCache: e2etest.CompilationCache(t),
	}
	if s.onLog != nil {
		opts.OnLog = func(e wasmhost.LogEntry) { s.onLog(int(e.Level), e.Message) }
	}
	host, err := wasmhost.New(context.Background(), wasmBytes, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { host.Close() })
	return &wazeroEngine{t: t, host: host}, nil
}

func (e *wazeroEngine) do(path string, headers map[string]string, upstreamStatus int) outcome {
	e.t.Helper()
	hdrs, upstream, body := splitHeaders(headers)
	ctx := context.Background()
	s := e.host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: path, Host: "api.example.com", Headers: hdrs, SourceAddress: "198.51.100.7:4242", RequestID: "rid-1"})
	defer s.Close()
	res, err := s.RequestHeaders(ctx)
	if err != nil {
		e.t.Fatalf("request headers: %v", err)
	}
	if res.Local != nil {
		m := map[string]string{}
		for _, kv := range res.Local.Headers {
			m[strings.ToLower(kv[0])] = kv[1]
		}
		return outcome{status: res.Local.Status, headers: m, body: string(res.Local.Body), vm: -1}
	}
	out, err := s.ResponseHeaders(ctx, upstreamStatus, upstream)
	if err != nil {
		e.t.Fatalf("response headers: %v", err)
	}
	_, cut := headers["upstream-cut"]
	for i, part := range body {
		if err := s.ResponseBody([]byte(part), i == len(body)-1 && !cut); err != nil {
			e.t.Fatalf("response body: %v", err)
		}
	}
	m := map[string]string{}
	for _, kv := range out.Headers {
		m[strings.ToLower(kv[0])] = kv[1]
	}
	return outcome{status: upstreamStatus, headers: m, vm: -1}
}

func (e *wazeroEngine) metric(name string) int64 {
	v, _ := e.host.Metric(name)
	return v
}

func (e *wazeroEngine) logs() []string {
	var out []string
	for _, l := range e.host.Logs() {
		out = append(out, l.Message)
	}
	return out
}

func (e *wazeroEngine) failures() int64 { return e.host.Failures() }

// wazeroHost returns the wasmhost host of a proxy started by startWazero.
func wazeroHost(p *proxy) *wasmhost.Host { return p.engine.(*wazeroEngine).host }

// The shared scenarios (scenarios_test.go) on wazero.

func TestWasm_LimitHeadersAndDenial(t *testing.T) { scenarioLimitHeadersAndDenial(t, startWazero) }
func TestWasm_RefusalsCounted(t *testing.T)       { scenarioRefusalsCounted(t, startWazero) }
func TestWasm_LogOnly(t *testing.T)               { scenarioLogOnly(t, startWazero) }
func TestWasm_QueryMatch(t *testing.T)            { scenarioQueryMatch(t, startWazero) }
func TestWasm_ChargeOnResponse(t *testing.T)      { scenarioChargeOnResponse(t, startWazero) }
func TestWasm_Lease(t *testing.T)                 { scenarioLease(t, startWazero) }
func TestWasm_Throttle(t *testing.T)              { scenarioThrottle(t, startWazero) }
func TestWasm_FailureModes(t *testing.T)          { scenarioFailureModes(t, startWazero) }
func TestWasm_Environment(t *testing.T)           { scenarioEnvironment(t, startWazero) }
func TestWasm_ConfigRefused(t *testing.T)         { scenarioConfigRefused(t, startWazero) }
func TestWasm_PanicKeepsVMServing(t *testing.T)   { scenarioPanic(t, startWazero) }

func TestWasm_ConfigureRefusedKeepsPrevious(t *testing.T) {
	h := startProxy(t, startWazero, engineSetup{mode: "fail_open"})
	err := wazeroHost(h).Configure(context.Background(), []byte(`{"rules":[{"name":"x","limit":-1,"window":"1s"}]}`))
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
	for _, m := range h.logs() {
		logged = logged || strings.Contains(m, "rules[0].limit")
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
	h := startProxy(t, startWazero, engineSetup{mode: "fail_closed", timeout: "5s"})
	var passed [4]atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				u := g % 4
				ctx := context.Background()
				s := wazeroHost(h).NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: "/api/x", Headers: [][2]string{{"x-user-id", fmt.Sprint("u", u)}}, SourceAddress: "198.51.100.7:1"})
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
// inProcessHost starts the built plugin in a wasmhost host with opts,
// whose cluster "bridge" is b, called in process; it closes with tb.
func inProcessHost(tb testing.TB, b *fakeBridge, opts wasmhost.Options) *wasmhost.Host {
	tb.Helper()
	opts.RootID = "sluice"
	opts.Clusters = map[string]string{"bridge": "http://bridge.invalid"}
	opts.HTTPClient = &http.Client{Transport: inProcess{b}}
	opts.CompilationCache = e2etest.CompilationCache(tb)
	host, err := wasmhost.New(context.Background(), wasmBytes, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { host.Close() })
	return host
}

type inProcess struct{ h http.Handler }

func (p inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	p.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// BenchmarkWasm measures whole requests through the built plugin in the wasmhost
// host (wazero compiler), logging at info as Envoy does by default: the
// paths of wazeroPaths. A request the plugin lets through gets a response,
// which passes the plugin as in Envoy (and in BenchmarkWasmV8's host); a
// local reply passes it too. cpu-ns/op is the whole process (host and
// guest); guest-ns/op is the plugin's own code, all its guest callbacks
// of the request (host functions excluded); above-baseline-ns/op is what
// make bench's table shows (aboveBaseline). baseline-disabled is the
// host's own cost per request: the same requests under a disabled config,
// where the filter returns at once.
func BenchmarkWasm(b *testing.B) {
	bridge := &fakeBridge{counts: map[string]int64{}}
	start := func(cfg string) *wasmhost.Host {
		return inProcessHost(b, bridge, wasmhost.Options{
			Workers: 1, PluginConfig: []byte(cfg), MeasureGuest: true,
			LogLevel: wasmhost.LogLevelInfo, // Envoy's default: no debug event per allowed request
		})
	}
	host, jwtHost, disabled := start(benchConfig), start(jwtBenchConfig), start(`{"enabled":false}`)
	ctx := context.Background()
	// requests runs n requests of p on h and returns their guest ns each;
	// user "" is a new user for each request, p.clients that many in turn.
	var clients int
	requests := func(b *testing.B, h *wasmhost.Host, p benchPath, n int) float64 {
		path, user := p.path, p.user
		info := wasmhost.RequestInfo{Method: "GET", Path: path, Host: "api.example.com", SourceAddress: "198.51.100.7:4242",
			Headers: [][2]string{{"x-user-id", user}, {"x-request-id", "rid"}}}
		if p.jwt {
			info.Headers[0] = [2]string{"authorization", jwtBenchToken(user)}
		}
		upstream := [][2]string{{"content-type", "text/plain"}}
		users := make([]string, p.clients)
		for i := range users {
			users[i] = "client-" + strconv.Itoa(i)
		}
		guest := h.GuestTime()
		for i := range n {
			switch {
			case p.clients > 0:
				info.Headers[0][1] = users[i%p.clients]
			case user == "":
				clients++
				info.Headers[0][1] = "client-" + strconv.Itoa(clients)
			}
			s := h.NewStream(ctx, info)
			res, err := s.RequestHeaders(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if res.Local == nil {
				if _, err := s.ResponseHeaders(ctx, 200, upstream); err != nil {
					b.Fatal(err)
				}
			}
			s.Close()
		}
		return float64(h.GuestTime()-guest) / float64(n)
	}
	bridge.mu.Lock()
	bridge.counts[overLimitKey] = 1 << 40
	bridge.mu.Unlock()
	for _, h := range []*wasmhost.Host{host, jwtHost} { // caches mallory's denial
		hdr := [2]string{"x-user-id", "mallory"}
		if h == jwtHost {
			hdr = [2]string{"authorization", jwtBenchToken("mallory")}
		}
		s := h.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{hdr}})
		s.RequestHeaders(ctx)
		s.Close()
	}
	aboveNs := map[string]float64{}
	for _, p := range wazeroPaths {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			var cpu int64
			h := host
			if p.jwt {
				h = jwtHost
			}
			above, guest, base := aboveBaseline(b, func(n int) float64 {
				c := cpuNanos()
				g := requests(b, h, p, n)
				cpu += cpuNanos() - c
				return g
			}, func(n int) float64 { return requests(b, disabled, p, n) })
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			reportGuest(b, above, guest, base)
			aboveNs[p.name] = above
		})
	}
	b.Run("baseline-disabled", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cpuNanos()
		b.ReportMetric(requests(b, disabled, benchPaths[2], b.N), "guest-ns/op")
		b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N), "cpu-ns/op")
	})
	appendGuestRows(b, "wazero", aboveNs)
}

// BenchmarkWasmChargeBody measures what reading a language model's answer
// for its usage (on_response's cost_body) costs the plugin on wazero: a
// request charged after its response by a header, and one charged by a
// 40 KiB JSON body; guest-ns/op is the plugin's own code, and
// guest-ns/KiB what the body adds per KiB over the header case.
func BenchmarkWasmChargeBody(b *testing.B) {
	host := inProcessHost(b, &fakeBridge{counts: map[string]int64{}}, wasmhost.Options{
		Workers: 1, PluginConfig: []byte(benchConfig), MeasureGuest: true, LogLevel: wasmhost.LogLevelInfo})
	answer := []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("lorem ipsum ", 3400) + `"}}],"usage":{"total_tokens":7}}`)
	ctx := context.Background()
	run := func(path string, n int) float64 {
		g := host.GuestTime()
		for range n {
			s := host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: path, SourceAddress: "198.51.100.7:1",
				Headers: [][2]string{{"x-user-id", "alice"}}})
			if _, err := s.RequestHeaders(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := s.ResponseHeaders(ctx, 200, [][2]string{{"content-type", "application/json"}, {"x-cost", "7"}}); err != nil {
				b.Fatal(err)
			}
			if err := s.ResponseBody(answer, true); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
		return float64(host.GuestTime()-g) / float64(n)
	}
	var header float64
	for _, c := range []struct{ name, path string }{{"header", "/charged/x"}, {"body", "/charged-body/x"}} {
		b.Run(c.name, func(b *testing.B) {
			g := run(c.path, b.N)
			b.ReportMetric(g, "guest-ns/op")
			if c.name == "header" {
				header = g
			} else if header > 0 {
				b.ReportMetric((g-header)/(float64(len(answer))/1024), "guest-ns/KiB")
			}
		})
	}
}

// cpuNanos is the CPU time (user + system) this process has used.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// The guest heap stays flat: after a warm-up, 200,000 requests over the
// no-match, cache-hit, lease-hit and call-out paths, and call-outs that
// charge a limit after the response, by a header or by what a 20 KiB body
// says, leave every VM's linear memory the size it was. A request that
// kept even one byte would grow it by three 64 KiB pages. make test-long
// runs two million (TestLong_WasmHeapFlat).
func TestWasm_HeapFlat(t *testing.T) { heapFlat(t, 200_000) }

// heapFlat runs n requests after a warm-up of 20,000 and checks that no
// VM's linear memory grew.
func heapFlat(t *testing.T, n int) {
	bridge := &fakeBridge{counts: map[string]int64{overLimitKey: 1 << 40}}
	host := inProcessHost(t, bridge, wasmhost.Options{Workers: 2, PluginConfig: []byte(benchConfig), LogCapacity: 16})
	ctx := context.Background()
	infos := []wasmhost.RequestInfo{
		{Method: "GET", Path: "/health", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
		{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "mallory"}}},
		{Method: "GET", Path: "/api/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
		{Method: "GET", Path: "/hot/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
		{Method: "GET", Path: "/charged/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
		{Method: "GET", Path: "/charged-body/x", SourceAddress: "198.51.100.7:1", Headers: [][2]string{{"x-user-id", "alice"}}},
	}
	// A language model's answer of about 20 KiB, its usage at the end: read
	// in two parts.
	answer := []byte(`{"choices":[{"message":{"content":"` + strings.Repeat("lorem ipsum ", 1700) + `"}}],"usage":{"total_tokens":7}}`)
	run := func(n int) {
		for i := 0; i < n; i++ {
			info := infos[[...]int{0, 1, 3}[i%3]] // no match, cache hit, lease hit
			body := i%100 == 40
			switch {
			case i%50 == 0:
				info = infos[2] // a call-out now and then
			case i%50 == 25:
				info = infos[4] // one charged after its response
			case body:
				info = infos[5] // and one charged what its body says
			}
			s := host.NewStream(ctx, info)
			res, err := s.RequestHeaders(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if i%50 == 25 || body {
				if res.Local != nil {
					t.Fatalf("a charged request refused: %+v", res.Local)
				}
				if _, err := s.ResponseHeaders(ctx, 200, [][2]string{{"x-cost", "3"}, {"content-type", "application/json"}}); err != nil {
					t.Fatal(err)
				}
				if body {
					if err := s.ResponseBody(answer, true); err != nil {
						t.Fatal(err)
					}
				}
			}
			s.Close()
		}
	}
	run(20_000)
	before := host.MemorySizes()
	run(n)
	after := host.MemorySizes()
	if c, _ := host.Metric("sluice_charges_total"); c < int64(n/50+n/100) {
		t.Errorf("%d charges in %d requests, want three in 100", c, n)
	}
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("VM %d: linear memory grew from %d to %d bytes over %d requests", i, before[i], after[i], n)
		}
	}
	t.Logf("linear memory per VM: %v bytes", after)
}

// TestWasm_HeapFlatThrottled: requests a throttle limit holds and the
// tick resumes leave the VMs' memory as they found it: rounds of 1,000
// held requests (100 at a time, one slot a millisecond) after a round
// that warmed them up.
func TestWasm_HeapFlatThrottled(t *testing.T) {
	host := inProcessHost(t, &fakeBridge{counts: map[string]int64{}}, wasmhost.Options{
		Workers: 2, LogCapacity: 16,
		PluginConfig: []byte(`{"bridge": {"cluster": "bridge", "timeout": "1s"},
  "rules": [{"name": "t", "match": {"paths": ["/t"]}, "scope": "global", "limit": 1000, "window": "1s",
             "algorithm": "fixed_window", "action": "throttle", "max_delay": "5s"}]}`),
	})
	ctx := context.Background()
	round := func() {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 100 {
			wg.Go(func() {
				for next.Add(1) <= 1000 {
					s := host.NewStream(ctx, wasmhost.RequestInfo{Method: "GET", Path: "/t", SourceAddress: "198.51.100.7:1"})
					r, err := s.RequestHeaders(ctx)
					s.Close()
					if err != nil || r.Local != nil {
						t.Errorf("a held request: %+v %v", r.Local, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	round()
	before := host.MemorySizes()
	for range 2 {
		round()
	}
	if held, _ := host.Metric("sluice_throttled_total"); held < 2000 {
		t.Fatalf("%d held in 3,000 requests: the rounds must hold most", held)
	}
	after := host.MemorySizes()
	for i := range before {
		if after[i] != before[i] {
			t.Errorf("VM %d: linear memory grew from %d to %d bytes over 2,000 held requests", i, before[i], after[i])
		}
	}
	t.Logf("linear memory per VM: %v bytes", after)
}
