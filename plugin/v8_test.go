//go:build !wasip1

package main

// The built plugin on V8, Envoy's default engine, through Node.js and the
// project's Envoy-faithful host (internal/v8host): the shared scenarios
// (scenarios_test.go), and the benchmark beside wazero's.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/v8host"
)

// v8Engine runs the plugin on V8.
type v8Engine struct {
	t    *testing.T
	host *v8host.Host
}

func startV8(t *testing.T, s engineSetup, bridgeURL string) (engine, error) {
	opts := v8host.Options{
		Workers: s.workerCount(), PluginConfig: []byte(s.pluginConfig()), RootID: "sluice",
		Clusters: map[string]string{"bridge": bridgeURL}, Environment: s.env,
	}
	if s.onLog != nil {
		opts.OnLog = func(e v8host.LogEntry) { s.onLog(int(e.Level), e.Message) }
	}
	host, err := v8host.New(context.Background(), wasmBytes, opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { host.Close() })
	return &v8Engine{t: t, host: host}, nil
}

func (e *v8Engine) do(path string, headers map[string]string, upstreamStatus int) outcome {
	e.t.Helper()
	hdrs, upstream, body := splitHeaders(headers)
	r, err := e.host.Do(context.Background(), v8host.Request{Path: path, Authority: "api.example.com", Headers: hdrs,
		SourceAddress: "198.51.100.7:4242", RequestID: "rid-1",
		UpstreamStatus: upstreamStatus, UpstreamHeaders: upstream, UpstreamBody: body, UpstreamCut: headers["upstream-cut"] != ""})
	if err != nil {
		e.t.Fatalf("request: %v", err)
	}
	if r.Reset {
		e.t.Fatalf("the stream was reset: %+v", r)
	}
	m := map[string]string{}
	for _, kv := range r.Headers {
		m[kv[0]] = kv[1]
	}
	return outcome{status: r.Status, headers: m, body: string(r.Body), vm: r.VM}
}

func (e *v8Engine) metric(name string) int64 {
	e.t.Helper()
	m, err := e.host.Metrics(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return m[name]
}

func (e *v8Engine) logs() []string {
	var out []string
	for _, l := range e.host.Logs() {
		out = append(out, l.Message)
	}
	return out
}

func (e *v8Engine) failures() int64 { return int64(len(e.host.Failures())) }

func TestV8_LimitHeadersAndDenial(t *testing.T) { scenarioLimitHeadersAndDenial(t, startV8) }
func TestV8_RefusalsCounted(t *testing.T)       { scenarioRefusalsCounted(t, startV8) }
func TestV8_LogOnly(t *testing.T)               { scenarioLogOnly(t, startV8) }
func TestV8_QueryMatch(t *testing.T)            { scenarioQueryMatch(t, startV8) }
func TestV8_ChargeOnResponse(t *testing.T)      { scenarioChargeOnResponse(t, startV8) }
func TestV8_Lease(t *testing.T)                 { scenarioLease(t, startV8) }
func TestV8_Throttle(t *testing.T)              { scenarioThrottle(t, startV8) }
func TestV8_FailureModes(t *testing.T)          { scenarioFailureModes(t, startV8) }
func TestV8_Environment(t *testing.T)           { scenarioEnvironment(t, startV8) }
func TestV8_ConfigRefused(t *testing.T)         { scenarioConfigRefused(t, startV8) }
func TestV8_PanicKeepsVMServing(t *testing.T)   { scenarioPanic(t, startV8) }

// A local reply on V8 is what Envoy sends: the plugin's headers, then
// content-length, after ":status"; its details are the plugin's.
func TestV8_DenialAsEnvoySendsIt(t *testing.T) {
	h := startProxy(t, startV8, engineSetup{mode: "fail_open", workers: 1})
	host := h.engine.(*v8Engine).host
	req := v8host.Request{Path: "/api/items", Headers: [][2]string{{"X-User-Id", "zoe"}}, SourceAddress: "198.51.100.7:4242", RequestID: "rid-9"}
	for i := 0; i < 3; i++ {
		if r, err := host.Do(context.Background(), req); err != nil || r.Status != 200 || r.Local {
			t.Fatalf("request %d: %+v %v", i+1, r, err)
		}
	}
	r, err := host.Do(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Local || r.Status != 429 || r.Details != "sluice" || r.Headers[0] != [2]string{":status", "429"} {
		t.Fatalf("denial: %+v", r)
	}
	names := make([]string, len(r.Headers))
	for i, kv := range r.Headers {
		names[i] = kv[0]
	}
	if got := strings.Join(names, " "); !strings.HasPrefix(got, ":status content-type x-ratelimit-") || !strings.HasSuffix(got, " content-length") {
		t.Errorf("header order %q", got)
	}
	if cl, _ := r.Header("content-length"); cl != strconv.Itoa(len(r.Body)) {
		t.Errorf("content-length %q for a %d-byte body", cl, len(r.Body))
	}
}

// BenchmarkWasmV8 is BenchmarkWasm on V8: the same configurations, the
// same requests but a new client's (benchPaths and jwtPaths), one worker. guest-ns/op is measured inside Node as
// wazero's is: every module call of the request, host functions (and the
// allocations they ask the module for) excluded. node-ns/op is the whole
// request in Node's host, node-cpu-ns/op Node's CPU time per request
// (the bridge, an httptest server, is in this process, not Node's).
func BenchmarkWasmV8(b *testing.B) {
	const benchWarmup = 2000
	bridge, url := newBridge(b)
	bridge.mu.Lock()
	bridge.counts[overLimitKey] = 1 << 40
	bridge.mu.Unlock()
	start := func(cfg string) *v8host.Host {
		host, err := v8host.New(context.Background(), wasmBytes, v8host.Options{
			Workers: 1, PluginConfig: []byte(cfg), RootID: "sluice", Clusters: map[string]string{"bridge": url},
			LogLevel: v8host.LogInfo, // Envoy's default: no debug event per allowed request
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { host.Close() })
		return host
	}
	host, jwtHost, disabled := start(benchConfig), start(jwtBenchConfig), start(`{"enabled":false}`)
	ctx := context.Background()
	request := func(p benchPath) v8host.Request {
		id := [2]string{"x-user-id", p.user}
		if p.jwt {
			id = [2]string{"authorization", jwtBenchToken(p.user)}
		}
		return v8host.Request{Path: p.path, Authority: "api.example.com", SourceAddress: "198.51.100.7:4242",
			Headers: [][2]string{id, {"x-request-id", "rid"}}}
	}
	for _, p := range []benchPath{benchPaths[1], jwtPaths[0]} { // caches mallory's denial
		h := host
		if p.jwt {
			h = jwtHost
		}
		if _, err := h.Do(ctx, request(p)); err != nil {
			b.Fatal(err)
		}
	}
	bench := func(b *testing.B, h *v8host.Host, p benchPath, n int) v8host.BenchResult {
		r, err := h.Bench(ctx, request(p), n)
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	aboveNs := map[string]float64{}
	for _, p := range slices.Concat(benchPaths, jwtPaths) {
		b.Run(p.name, func(b *testing.B) {
			h := host
			if p.jwt {
				h = jwtHost
			}
			// V8 compiles a function when it first runs: a proxy serving
			// traffic has run them all, so the measure starts warm.
			bench(b, h, p, benchWarmup)
			bench(b, disabled, p, benchWarmup)
			var wall, cpu float64
			above, guest, base := aboveBaseline(b, func(n int) float64 {
				r := bench(b, h, p, n)
				wall, cpu = wall+r.WallNs*float64(n), cpu+r.CPUNs*float64(n)
				return r.GuestNs
			}, func(n int) float64 { return bench(b, disabled, p, n).GuestNs })
			reportGuest(b, above, guest, base)
			b.ReportMetric(wall/float64(b.N), "node-ns/op")
			b.ReportMetric(cpu/float64(b.N), "node-cpu-ns/op")
			aboveNs[p.name] = above
		})
	}
	b.Run("baseline-disabled", func(b *testing.B) {
		bench(b, disabled, benchPaths[2], benchWarmup)
		r := bench(b, disabled, benchPaths[2], b.N)
		b.ReportMetric(r.GuestNs, "guest-ns/op")
		b.ReportMetric(r.WallNs, "node-ns/op")
		b.ReportMetric(r.CPUNs, "node-cpu-ns/op")
	})
	appendGuestRows(b, "V8", aboveNs)
}
