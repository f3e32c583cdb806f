package distributed

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/proccpu"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// BenchmarkHotKey sends one key at about the machine's maximum request
// rate (32 clients, each with one request in flight) through 2 gateways
// (cmd/gateway processes, 4 worker VMs each) to 3 bridges on one
// redis-server, and reports per request: call-outs to the bridges, script
// calls and Redis commands, and the gateways' CPU. Latency (p50, p99) is
// measured apart, 3000 requests at 1000 a second, where it is the cost
// of a request rather than the queue of a saturated machine; and for a
// limit below the rate, admitted/limit per whole window of a 3.5 s run.
// Modes: the bridges deciding each check in a script call of its own
// (--redis-batch 1) and batched (the default), both without leases;
// leases (size 100, ttl 1s); the over-limit cache answering; the plugin
// disabled (the gateways' own latency, to subtract); and a fixed window
// of 1000 per second, without and with leases. Run it with
//
//	go test -run '^$' -bench HotKey -benchtime 20000x ./e2e/distributed
func BenchmarkHotKey(b *testing.B) {
	rs := redistest.Start(b)
	dir := b.TempDir()
	plugin := filepath.Join(dir, "plugin.wasm")
	if err := os.WriteFile(plugin, e2etest.Plugin(b), 0o644); err != nil {
		b.Fatal(err)
	}
	gateway := filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", gateway, "../../cmd/gateway").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	b.Cleanup(upstream.Close)
	rule := func(limit, window, lease string) string {
		return `{"failure_mode": "fail_closed", "bridge": {"timeout": "1s"},
  "rules": [{"name": "hot", "match": {"paths": ["/hot"]}, "scope": "global", "algorithm": "fixed_window",
             "limit": ` + limit + `, "window": "` + window + `"` + lease + `}]}`
	}
	const unlimited, lease = "1000000000000", `, "lease": {"size": 100, "ttl": "1s"}`
	for _, m := range []struct {
		name, config string
		batch        int
		perWindow    int // the limit per second, for admitted/limit
	}{
		{"no-lease/batch-1", rule(unlimited, "1h", ""), 1, 0},
		{"no-lease", rule(unlimited, "1h", ""), 0, 0},
		{"lease", rule(unlimited, "1h", lease), 0, 0},
		{"over-limit-cache", rule("1", "1h", ""), 0, 0},
		{"disabled", `{"enabled": false}`, 0, 0},
		{"at-limit/no-lease", rule("1000", "1s", ""), 0, 1000},
		{"at-limit/lease", rule("1000", "1s", lease), 0, 1000},
	} {
		b.Run(m.name, func(b *testing.B) {
			cfg := filepath.Join(b.TempDir(), "config.json")
			if err := os.WriteFile(cfg, []byte(m.config), 0o644); err != nil {
				b.Fatal(err)
			}
			var bridges []string
			for range bridgeCount {
				bridges = append(bridges, startBridgeBatch(b, rs.URL, time.Second, m.batch).addr)
			}
			lb := startBalancer(b, bridges)
			var gws []string
			var pids []int
			for range 2 {
				addr, pid := startGateway(b, gateway, plugin, cfg, dir, "http://"+lb, upstream.URL)
				gws, pids = append(gws, addr), append(pids, pid)
			}
			c := newHotClient()
			// A fresh key per mode: the store's state of one mode does
			// not meet the next; then warm up connections and VMs.
			if _, err := redistest.Do(rs.Addr, time.Second, "FLUSHALL"); err != nil {
				b.Fatal(err)
			}
			c.drive(b, gws, 32, 2000)
			n := max(b.N, 2000)
			var run *hotRun
			stats0, calls0, cpu0 := redisCalls(b, rs.Addr), bridgeCalls(b, bridges), gatewayCPU(b, pids)
			b.ResetTimer()
			if m.perWindow > 0 {
				run = c.driveFor(b, gws, 32, 3500*time.Millisecond)
				n = len(run.lat)
			} else {
				run = c.drive(b, gws, 32, n)
			}
			b.StopTimer()
			stats1, calls1, cpu1 := redisCalls(b, rs.Addr), bridgeCalls(b, bridges), gatewayCPU(b, pids)
			d := float64(n)
			b.ReportMetric(d/run.elapsed.Seconds(), "req/s")
			b.ReportMetric(float64(calls1-calls0)/d, "callouts/req")
			b.ReportMetric(float64(stats1.scripts-stats0.scripts)/d, "scripts/req")
			b.ReportMetric(float64(stats1.all-stats0.all-1)/d, "redis-cmds/req")
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/d, "gw-cpu-µs/req")
			if m.perWindow > 0 {
				lo, hi := run.admittedPerWindow(m.perWindow)
				b.ReportMetric(lo, "min-admitted/limit")
				b.ReportMetric(hi, "max-admitted/limit")
			} else {
				paced := c.drivePaced(b, gws, 1000, 3000)
				b.ReportMetric(paced.percentile(50).Seconds()*1000, "p50-ms")
				b.ReportMetric(paced.percentile(99).Seconds()*1000, "p99-ms")
			}
			b.Logf("%s: %d requests, statuses %v", m.name, n, run.statuses)
		})
	}
}

// hotClient sends GET /hot over keep-alive connections.
type hotClient struct{ c *http.Client }

func newHotClient() *hotClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 128
	tr.DisableCompression = true
	return &hotClient{c: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

type hotRun struct {
	elapsed  time.Duration
	lat      []time.Duration // sorted
	statuses map[int]int
	// admitted per window end (X-RateLimit-Reset) and the run's span
	windows     map[int64]int
	first, last time.Time
}

func (r *hotRun) percentile(p float64) time.Duration { return r.lat[int(float64(len(r.lat)-1)*p/100)] }

// admittedPerWindow returns the least and most admitted/limit over the
// windows of a second the run spans whole.
func (r *hotRun) admittedPerWindow(limit int) (float64, float64) {
	lo, hi := 1e9, 0.0
	for end, n := range r.windows {
		if time.Unix(end-1, 0).After(r.first) && time.Unix(end, 0).Before(r.last) {
			f := float64(n) / float64(limit)
			lo, hi = min(lo, f), max(hi, f)
		}
	}
	if hi == 0 {
		return 0, 0
	}
	return lo, hi
}

// drive sends n requests from conns concurrent clients, alternating the
// gateways.
func (c *hotClient) drive(b *testing.B, gws []string, conns, n int) *hotRun {
	var next atomic.Int64
	return c.run(b, gws, conns, n, func(int) bool { return int(next.Add(1))-1 < n })
}

// driveFor sends requests from conns concurrent clients for d.
func (c *hotClient) driveFor(b *testing.B, gws []string, conns int, d time.Duration) *hotRun {
	end := time.Now().Add(d)
	return c.run(b, gws, conns, 0, func(int) bool { return time.Now().Before(end) })
}

// drivePaced sends n requests at rate a second, each on time whatever
// the others took (from up to 64 clients).
func (c *hotClient) drivePaced(b *testing.B, gws []string, rate, n int) *hotRun {
	t0 := time.Now()
	var next atomic.Int64
	return c.run(b, gws, 64, n, func(int) bool {
		i := next.Add(1) - 1
		if int(i) >= n {
			return false
		}
		time.Sleep(time.Until(t0.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		return true
	})
}

// run sends requests from conns clients while more says so, alternating
// the gateways.
func (c *hotClient) run(b *testing.B, gws []string, conns, n int, more func(client int) bool) *hotRun {
	type answer struct {
		lat    time.Duration
		status int
		reset  int64
	}
	out := make([][]answer, conns)
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range conns {
		wg.Go(func() {
			for i := k; more(k); i += conns {
				start := time.Now()
				res, err := c.c.Get("http://" + gws[i%len(gws)] + "/hot")
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				a := answer{lat: time.Since(start), status: res.StatusCode}
				a.reset, _ = strconv.ParseInt(res.Header.Get("X-RateLimit-Reset"), 10, 64)
				out[k] = append(out[k], a)
			}
		})
	}
	wg.Wait()
	r := &hotRun{elapsed: time.Since(t0), statuses: map[int]int{}, windows: map[int64]int{}, first: t0, last: time.Now()}
	r.lat = make([]time.Duration, 0, n)
	for _, as := range out {
		for _, a := range as {
			r.lat = append(r.lat, a.lat)
			r.statuses[a.status]++
			if a.status == 200 && a.reset > 0 {
				r.windows[a.reset]++
			}
		}
	}
	sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
	return r
}

// startGateway starts cmd/gateway (bin) with 4 worker VMs and returns its
// address and pid; it is stopped when b ends.
func startGateway(b *testing.B, bin, plugin, config, cache, bridge, upstream string) (string, int) {
	addr := nettest.FreeAddr(b)
	cmd := exec.Command(bin, "--listen", addr, "--plugin", plugin, "--config", config, "--upstream", upstream,
		"--cluster", "sluice_bridge="+bridge, "--workers", "4", "--log-level", "error", "--compile-cache", cache)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, cmd.Process.Pid
		}
		if time.Now().After(end) {
			b.Fatal("the gateway did not start")
		}
	}
}

// startBalancer forwards each TCP connection to the next of targets: the
// load balancing of a proxy's cluster over the bridge's endpoints, per
// connection (keep-alive connections stay on one bridge).
func startBalancer(b *testing.B, targets []string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	var next atomic.Uint64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", targets[next.Add(1)%uint64(len(targets))])
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.Close() }()
				io.Copy(c, up)
			}()
		}
	}()
	return ln.Addr().String()
}

// redisCalls returns the script calls and all commands Redis ran so far
// (INFO commandstats; the commands scripts run count too).
func redisCalls(b *testing.B, addr string) redisStats {
	st, err := redistest.CommandStats(addr)
	if err != nil {
		b.Fatal(err)
	}
	var s redisStats
	for name, n := range st {
		if !strings.HasSuffix(name, ".usec") {
			s.all += n
		}
	}
	s.scripts = st["evalsha"] + st["eval"]
	return s
}

type redisStats struct{ scripts, all int64 }

// bridgeCalls sums the checks (and lease calls) the bridges served.
func bridgeCalls(b *testing.B, bridges []string) int64 {
	var n int64
	for _, addr := range bridges {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "sluice_bridge_checks_total{") || strings.HasPrefix(line, "sluice_bridge_lease_calls_total{") {
				v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				n += int64(v)
			}
		}
		res.Body.Close()
	}
	return n
}

// gatewayCPU is the CPU time (user and system) the processes pids used.
func gatewayCPU(b *testing.B, pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		c, err := proccpu.Of(pid)
		if err != nil {
			b.Fatal(err)
		}
		d += c
	}
	return d
}
