package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/benchtable"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/proccpu"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/wasmhost"
)

var (
	benchRounds = flag.Int("bench.rounds", 3, "BenchmarkGateway: rounds of every case, interleaved; the table has their medians")
	benchPairs  = flag.Int("bench.pairs", 9, "BenchmarkGateway: back-to-back runs of the gateway without plugin and with it, for each of the no-match and call-out cases; each case's ratio is the median of its pairs' ratios")
)

// benchRoleEnv names the part of BenchmarkGateway a re-executed test
// binary plays (benchRole); TestMain runs it instead of the tests.
const benchRoleEnv = "SLUICE_GATEWAY_BENCH_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(benchRoleEnv); role != "" {
		if err := benchRole(role, os.Args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// benchRole serves one process of BenchmarkGateway until SIGTERM: args[0]
// is the address to listen on, args[1] the upstream URL where there is
// one. "gateway" is the command itself (run), with args its flags.
func benchRole(role string, args []string) error {
	if role == "gateway" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		return run(ctx, args, os.Stderr)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var h http.Handler
	switch role {
	case "upstream":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") })
	case "reverse-proxy", "gateway-no-plugin":
		up, err := url.Parse(args[1])
		if err != nil {
			return err
		}
		if role == "gateway-no-plugin" {
			h = newHandler(up, nil, nil, logger, settings{appendXFF: true, upstreamTimeout: defaultUpstreamTimeout})
		} else {
			h = &httputil.ReverseProxy{Transport: wasmhost.NewTransport(), Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up) }}
		}
	case "bridge":
		set := redisbridge.DefaultSettings()
		set.Logger = logger
		set.AuditLog = filepath.Join(os.TempDir(), fmt.Sprintf("sluice-bench-audit-%d.log", os.Getpid()))
		defer os.Remove(set.AuditLog)
		br, err := redisbridge.New(set) // the embedded memory store
		if err != nil {
			return err
		}
		defer br.Close()
		ln, err := net.Listen("tcp", args[0])
		if err != nil {
			return err
		}
		go br.Serve(ln) // the bridge's own listener: its HTTP/1.1 fast path
		waitTerm()
		return nil
	default:
		return fmt.Errorf("unknown role")
	}
	// The gateway without plugin binds as the gateway does; the upstream
	// and the reverse proxy as a plain net/http server.
	bind := func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	if role == "gateway-no-plugin" {
		bind = listen
	}
	ln, err := bind(args[0])
	if err != nil {
		return err
	}
	srv := newServer(h, settings{idleTimeout: defaultIdleTimeout, maxRequestHeadersKB: defaultMaxRequestHeadersKB})
	go srv.Serve(ln)
	waitTerm()
	return srv.Close()
}

func waitTerm() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	<-c
}

// benchProc is a process BenchmarkGateway started.
type benchProc struct {
	addr string
	pid  int
}

// startRole runs this test binary as role (benchRole) listening on a free
// loopback port, and waits until it accepts connections.
func startRole(b *testing.B, role string, args ...string) benchProc {
	addr := nettest.FreeAddr(b)
	if role == "gateway" {
		args = append([]string{"--listen", addr}, args...)
	} else {
		args = append([]string{addr}, args...)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), benchRoleEnv+"="+role)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			b.Fatalf("%s exited (%v): %s", role, err, stderr.String())
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return benchProc{addr: addr, pid: cmd.Process.Pid}
		}
		if time.Now().After(end) {
			b.Fatalf("%s did not start: %s", role, stderr.String())
		}
	}
}

// stallOver is the shortest gap WatchStalls counts: half of the p99 a
// call-out may add.
const stallOver = 500 * time.Microsecond

// gatewayCase is one way of serving a request that BenchmarkGateway
// measures.
type gatewayCase struct {
	label  string
	server *benchProc // the process that answers the load generator
	path   string
	base   bool
}

// gatewayRun is what one run of a case measured.
type gatewayRun struct {
	rate, p99ms, serverCPU, machineCPU, busy float64
	switches                                 float64 // the machine's context switches per request
}

// BenchmarkGateway compares, each as its own process on loopback as they
// are deployed, the upstream alone, a plain httputil.ReverseProxy in front
// of it, the gateway without the plugin, and the gateway with the plugin
// on a request no limit matches and on one that makes a call-out to the
// bridge (its own process, on its memory store, or embedded in the
// gateway's). The load generator (internal/loadgen: 50 keep-alive
// connections, 26 users, no allocation per request) runs in this process.
// Every case runs -bench.rounds times, interleaved; the table has the
// medians. The ratios of the no-match and call-out cases to the gateway
// without plugin are also each the median of -bench.pairs pairs of
// saturated runs back to back, the gateway without plugin and with it.
//
// Saturated: each connection sends its next request when it has the
// answer. Paced: the reverse proxy, the gateway without plugin and the
// call-out case at a half and a quarter of the call-out case's saturated
// rate, for the latency the plugin and its call-out add to the gateway
// when it is not saturated; with how busy the machine's CPUs were, since
// on a virtual machine a request that arrives at an idle CPU costs more
// than one of a saturated stream, and how many context switches a request
// cost the machine (every process and the kernel), where that cost is
// paid. Once a round, with every process idle, a thread spins alone on
// each CPU reading the clock: the gaps the machine leaves in its time
// (its kernel's own threads, the hypervisor) hold up any request caught
// in one, in whichever process it is, and set how low a paced p99 can
// go on this machine.
//
//	go test -run '^$' -bench Gateway -benchtime 20000x ./cmd/gateway
//
// It prints its table, or, with $SLUICE_BENCH_TABLE set, appends the rows
// there for internal/benchtable to print with the other parts.
func BenchmarkGateway(b *testing.B) {
	if b.N == 1 {
		return // the probe run of -benchtime Nx
	}
	n := b.N
	dir := b.TempDir()
	plugin := filepath.Join(dir, "plugin.wasm")
	config := filepath.Join(dir, "config.json")
	const cfg = `{"bridge": {"cluster": "sluice_bridge", "timeout": "1s"},
	  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 1000000000, "window": "1h", "algorithm": "fixed_window"}]}`
	if err := os.WriteFile(plugin, e2etest.Plugin(b), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	upstream := startRole(b, "upstream")
	bridge := startRole(b, "bridge")
	upURL := "http://" + upstream.addr
	proxy := startRole(b, "reverse-proxy", upURL)
	bare := startRole(b, "gateway-no-plugin", upURL)
	// As cmd/gateway runs by default: one plugin VM per CPU, plugin logs
	// at info (at debug the plugin formats an event for every allowed
	// request, which no deployment asks for).
	gateway := startRole(b, "gateway", "--plugin", plugin, "--config", config, "--upstream", upURL,
		"--cluster", "sluice_bridge=http://"+bridge.addr, "--log-level", "info")
	embedded := startRole(b, "gateway", "--plugin", plugin, "--config", config, "--upstream", upURL,
		"--embed-bridge", "sluice_bridge", "--log-level", "info")
	procs := []*benchProc{&upstream, &bridge, &proxy, &bare, &gateway, &embedded}
	cases := []gatewayCase{
		{label: "upstream alone", server: &upstream, path: "/api/x"},
		{label: "httputil.ReverseProxy", server: &proxy, path: "/api/x", base: true},
		{label: "gateway, no plugin", server: &bare, path: "/api/x"},
		{label: "gateway, plugin, no limit matches", server: &gateway, path: "/health"},
		{label: "gateway, plugin, a call-out per request (bridge on its memory store)", server: &gateway, path: "/api/x"},
		{label: "gateway, plugin, a call-out per request to the bridge in its process (--embed-bridge, memory store)", server: &embedded, path: "/api/x"},
	}
	const callout, embeddedCallout = 4, 5
	users := make([]string, 26)
	for i := range users {
		users[i] = "X-User-Id: u" + string(rune('a'+i)) + "\r\n"
	}
	measure := func(c gatewayCase, n int, rate float64) gatewayRun {
		cpu0 := make([]time.Duration, len(procs))
		for i, p := range procs {
			cpu0[i] = childCPU(b, p.pid)
		}
		busy0, total0, err := proccpu.Machine()
		if err != nil {
			b.Fatal(err)
		}
		sw0, err := proccpu.Switches()
		if err != nil {
			b.Fatal(err)
		}
		res, err := loadgen.Run(context.Background(), loadgen.Options{Addr: c.server.addr, Path: c.path,
			ConnHeaders: users, Conns: 50, N: n, Rate: rate})
		if err != nil {
			b.Fatalf("%s: %v", c.label, err)
		}
		busy1, total1, err := proccpu.Machine()
		if err != nil {
			b.Fatal(err)
		}
		sw1, err := proccpu.Switches()
		if err != nil {
			b.Fatal(err)
		}
		r := gatewayRun{rate: res.Rate(), p99ms: float64(res.Percentile(0.99).Microseconds()) / 1000,
			machineCPU: float64((busy1 - busy0).Microseconds()) / float64(n),
			busy:       100 * float64(busy1-busy0) / float64(total1-total0),
			switches:   float64(sw1-sw0) / float64(n)}
		for i, p := range procs {
			if p == c.server {
				r.serverCPU = float64((childCPU(b, p.pid) - cpu0[i]).Microseconds()) / float64(n)
			}
		}
		return r
	}
	for _, c := range cases { // connections, VMs, the bridge's keys
		measure(c, 2000, 0)
	}
	b.ResetTimer()
	saturated := make([][]gatewayRun, len(cases))
	type wakeRun struct{ us, cpuUS float64 } // a round trip and its CPU
	var wakes [2][]wakeRun                   // on two CPUs, on one
	var stalls [][]proccpu.Stalls            // by round, by CPU
	for range *benchRounds {
		for i, oneCPU := range []bool{false, true} {
			wall, cpu, err := proccpu.WakeRoundTrip(20000, oneCPU)
			if err != nil {
				b.Fatal(err)
			}
			wakes[i] = append(wakes[i], wakeRun{float64(wall.Nanoseconds()) / 1000, float64(cpu.Nanoseconds()) / 1000})
		}
		st, err := proccpu.WatchStalls(2*time.Second, stallOver)
		if err != nil {
			b.Fatal(err)
		}
		stalls = append(stalls, st)
		for i, c := range cases {
			saturated[i] = append(saturated[i], measure(c, n, 0))
		}
	}
	// The ratios to the gateway without plugin from pairs of runs back
	// to back, which goes first swapped from pair to pair: on this
	// machine a case's rate moves by a fifth from one second to the next,
	// more than the plugin costs when no limit matches, and the two runs
	// of a pair see the same weather where the medians of rounds need not.
	const noPlugin, noMatch = 2, 3
	rateOf := func(i int) float64 { return measure(cases[i], n, 0).rate }
	paired := []int{noMatch, callout, embeddedCallout}
	pairs := make([][]float64, len(cases)) // by case, of those paired
	for k := range max(*benchPairs, 1) {
		for _, i := range paired {
			var without, with float64
			if k%2 == 0 {
				without = rateOf(noPlugin)
				with = rateOf(i)
			} else {
				with = rateOf(i)
				without = rateOf(noPlugin)
			}
			pairs[i] = append(pairs[i], with/without)
		}
	}
	rate := benchtable.Median(saturated[callout], func(r gatewayRun) float64 { return r.rate })
	// Paced: the reverse proxy, the gateway without plugin and the
	// call-out case at the same rates.
	pacedCases := []int{1, 2, callout, embeddedCallout}
	type pacedRow struct {
		frac string
		rate float64
		runs [][]gatewayRun // by pacedCases
	}
	paced := []*pacedRow{{frac: "a half", rate: rate / 2}, {frac: "a quarter", rate: rate / 4}}
	for _, p := range paced {
		p.runs = make([][]gatewayRun, len(pacedCases))
	}
	// And the gateway without plugin paced to keep the machine as busy as
	// the call-out case kept it at half its saturated rate, in the same
	// round: what that load costs the p99 with no plugin and no call-out.
	// The rate scales by the busy shares, then again after each one-second
	// run at the estimate, up to three, until within 3 points: CPU per
	// request falls as the rate rises, so one step lands well short.
	var asBusy []gatewayRun
	var asBusyRates []float64
	for range *benchRounds {
		for _, p := range paced {
			np := max(int(p.rate*2), 1000) // two seconds each
			for j, i := range pacedCases {
				p.runs[j] = append(p.runs[j], measure(cases[i], np, p.rate))
			}
		}
		half, last := paced[0], len(paced[0].runs[1])-1
		target := half.runs[2][last].busy
		r := half.rate * target / max(half.runs[1][last].busy, 1)
		for range 3 {
			got := measure(cases[noPlugin], max(int(r), 1000), r).busy
			if math.Abs(got-target) < 3 {
				break
			}
			r *= target / max(got, 1)
		}
		asBusyRates = append(asBusyRates, r)
		asBusy = append(asBusy, measure(cases[noPlugin], max(int(r*2), 1000), r))
	}
	b.StopTimer()

	group := fmt.Sprintf("Gateway, each part its own process on loopback; 50 keep-alive clients (medians of %d rounds, interleaved)", *benchRounds)
	var rows []benchtable.Row
	for i, c := range cases {
		runs := saturated[i]
		rows = append(rows, benchtable.Row{Group: group, Name: c.label, Base: c.base, Metrics: []benchtable.Metric{
			{Name: "req/s", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.rate }), Ratio: true},
			{Name: "its process CPU µs/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.serverCPU }), Ratio: true},
			{Name: "machine CPU µs/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.machineCPU }), Ratio: true},
			{Name: "machine context switches/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.switches })},
			{Name: "p99 ms", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.p99ms })},
		}})
		b.Logf("%s: %+v", c.label, runs)
	}
	ratio := func(num, den int) float64 {
		return benchtable.Median(saturated[num], func(r gatewayRun) float64 { return r.rate }) /
			benchtable.Median(saturated[den], func(r gatewayRun) float64 { return r.rate })
	}
	rows = append(rows, benchtable.Row{Group: group, Name: "gateway, plugin, no limit matches, over the gateway without plugin: the medians above",
		Metrics: []benchtable.Metric{{Name: "req/s", Value: ratio(noMatch, noPlugin)}}})
	pairRatio := func(i int) float64 { return benchtable.Median(pairs[i], func(r float64) float64 { return r }) }
	for _, i := range paired {
		target := "0.50"
		if i == noMatch {
			target = "0.90"
		}
		rows = append(rows, benchtable.Row{Group: group,
			Name:    fmt.Sprintf("%s, over the gateway without plugin: median of %d pairs of runs back to back (target ≥ %s)", cases[i].label, len(pairs[i]), target),
			Metrics: []benchtable.Metric{{Name: "req/s", Value: pairRatio(i)}},
			Note:    fmt.Sprintf("pairs %.3f–%.3f", slices.Min(pairs[i]), slices.Max(pairs[i]))})
		b.Logf("%s over no-plugin, by pair: %.3f", cases[i].label, pairs[i])
	}
	for _, p := range paced {
		at := fmt.Sprintf("at %s of the call-out case's saturated rate (%.0f req/s)", p.frac, p.rate)
		for j, i := range pacedCases {
			runs := p.runs[j]
			rows = append(rows, benchtable.Row{Group: group, Name: cases[i].label + ", " + at, Metrics: []benchtable.Metric{
				{Name: "its process CPU µs/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.serverCPU })},
				{Name: "machine CPU µs/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.machineCPU })},
				{Name: "machine context switches/req", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.switches })},
				{Name: "p99 ms", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.p99ms })},
				{Name: "machine busy %", Value: benchtable.Median(runs, func(r gatewayRun) float64 { return r.busy })},
			}})
			b.Logf("%s, %s: %+v", cases[i].label, at, runs)
		}
		// What the plugin and its call-out add to the same gateway, in
		// the same round: to a bridge of its own, and to the embedded one.
		for _, c := range []struct {
			j    int // in pacedCases
			what string
		}{{2, "a call-out"}, {3, "a call-out to the embedded bridge"}} {
			j, what := c.j, c.what
			bare, call := p.runs[1], p.runs[j]
			added := make([]gatewayRun, len(call))
			addedMS := make([]float64, len(call))
			for i := range call {
				added[i].p99ms = call[i].p99ms - bare[i].p99ms
				addedMS[i] = added[i].p99ms
			}
			name := "p99 " + what + " adds over the gateway without plugin " + at
			if p.frac == "a half" && j == 2 {
				name += " (target < 1 ms)"
				b.ReportMetric(benchtable.Median(added, func(r gatewayRun) float64 { return r.p99ms })*1000, "half-sat-added-p99-us")
			}
			// The rounds' spread with the median: on a VM it is wider than
			// the target (docs/performance.md).
			rows = append(rows, benchtable.Row{Group: group, Name: name,
				Metrics: []benchtable.Metric{{Name: "p99 ms", Value: benchtable.Median(added, func(r gatewayRun) float64 { return r.p99ms })}},
				Note:    fmt.Sprintf("rounds %.2f to %.2f ms", slices.Min(addedMS), slices.Max(addedMS))})
		}
	}
	rows = append(rows, benchtable.Row{Group: group, Name: fmt.Sprintf("%s, paced to keep the machine as busy as the call-out case at a half of its saturated rate (%.0f req/s)",
		cases[noPlugin].label, benchtable.Median(asBusyRates, func(r float64) float64 { return r })), Metrics: []benchtable.Metric{
		{Name: "its process CPU µs/req", Value: benchtable.Median(asBusy, func(r gatewayRun) float64 { return r.serverCPU })},
		{Name: "machine CPU µs/req", Value: benchtable.Median(asBusy, func(r gatewayRun) float64 { return r.machineCPU })},
		{Name: "machine context switches/req", Value: benchtable.Median(asBusy, func(r gatewayRun) float64 { return r.switches })},
		{Name: "p99 ms", Value: benchtable.Median(asBusy, func(r gatewayRun) float64 { return r.p99ms })},
		{Name: "machine busy %", Value: benchtable.Median(asBusy, func(r gatewayRun) float64 { return r.busy })},
	}})
	b.Logf("%s, as busy as the call-out case at a half (%v req/s): %+v", cases[noPlugin].label, asBusyRates, asBusy)
	// What a hop costs that finds the next process asleep, on this
	// machine: the paced rows above pay several per request.
	wakeGroup := fmt.Sprintf("This machine: two threads waking each other through pipes, each blocked in read (medians of %d, one per round above)", *benchRounds)
	for i, where := range []string{"on two CPUs", "on one CPU"} {
		rows = append(rows, benchtable.Row{Group: wakeGroup, Name: where, Base: i == 1, Metrics: []benchtable.Metric{
			{Name: "round trip µs", Value: benchtable.Median(wakes[i], func(r wakeRun) float64 { return r.us }), Ratio: true},
			{Name: "CPU µs per round trip", Value: benchtable.Median(wakes[i], func(r wakeRun) float64 { return r.cpuUS }), Ratio: true},
		}})
	}
	// And what the machine takes away from a thread that never blocks:
	// a request held up in any process it passes through by such a gap
	// waits it out, which sets how low the paced rows' p99 can go here.
	stallGroup := fmt.Sprintf("This machine: a thread spinning alone on each CPU for 2 s, the processes above idle, gaps over %v between two clock reads (medians of %d, one per round above)", stallOver, *benchRounds)
	ncpu := 0
	for _, r := range stalls {
		ncpu = max(ncpu, len(r))
	}
	for cpu := range ncpu {
		var runs []proccpu.Stalls
		for _, r := range stalls {
			if cpu < len(r) {
				runs = append(runs, r[cpu])
			}
		}
		rows = append(rows, benchtable.Row{Group: stallGroup, Name: fmt.Sprintf("CPU %d", cpu), Metrics: []benchtable.Metric{
			{Name: "time lost %", Value: benchtable.Median(runs, func(s proccpu.Stalls) float64 { return 100 * s.Lost.Seconds() / s.Span.Seconds() })},
			{Name: "gaps a second", Value: benchtable.Median(runs, func(s proccpu.Stalls) float64 { return float64(s.Count) / s.Span.Seconds() })},
			{Name: "longest ms", Value: benchtable.Median(runs, func(s proccpu.Stalls) float64 { return float64(s.Longest.Microseconds()) / 1000 })},
		}})
		b.Logf("CPU %d, stalls by round: %+v", cpu, runs)
	}
	b.ReportMetric(rate, "call-out-req/s")
	b.ReportMetric(ratio(callout, 1), "call-out/reverse-proxy")
	b.ReportMetric(pairRatio(noMatch), "no-match/no-plugin")
	b.ReportMetric(pairRatio(callout), "call-out/no-plugin")
	if os.Getenv(benchtable.Env) == "" {
		var sb strings.Builder
		benchtable.Print(&sb, rows)
		fmt.Fprintf(os.Stdout, "\n%s\n", sb.String())
	} else if err := benchtable.Append(rows...); err != nil {
		b.Fatal(err)
	}
}

// childCPU is the CPU time process pid has used.
func childCPU(b *testing.B, pid int) time.Duration {
	d, err := proccpu.Of(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
