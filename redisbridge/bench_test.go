package redisbridge

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/proccpu"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// Load shape of the benchmarks: 50 concurrent HTTP clients, 10,000 users,
// every check allowed (limits far above the load).
const (
	benchClients = 50
	benchUsers   = 10_000
	// Over h2c the 50 requests in flight share 2 connections, as with a
	// proxy of 2 worker threads (Envoy opens an HTTP/2 connection per
	// worker and upstream host).
	benchH2Conns = 2
)

var benchAlgs = []rules.Algorithm{rules.TokenBucket, rules.SlidingWindow, rules.SlidingLog, rules.FixedWindow}

func benchBodies(alg rules.Algorithm) [][]byte {
	bodies := make([][]byte, benchUsers)
	for i := range bodies {
		user := "u" + strconv.Itoa(i)
		key := rules.AppendKey(nil, "api"+alg.String(), rules.Scope(rules.ScopeUser), &rules.Identity{User: user}, rules.AnonymousIP, "", "")
		l := rules.LimitRequest{Key: string(key), Rule: "bench", PerUser: true,
			Spec: rules.LimitSpec{Algorithm: alg, Limit: 1 << 30, WindowMS: 60_000, Burst: 1 << 30, Cost: 1}}
		if alg == rules.SlidingLog {
			l.Spec.WindowMS = 2_000 // the log keeps one entry per request: keep it short
		}
		bodies[i] = rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{User: user, Endpoint: "/bench", Limits: []rules.LimitRequest{l}})
	}
	return bodies
}

// load posts the bodies from benchClients goroutines, n checks in all, and
// returns sorted latencies.
func load(b *testing.B, url string, bodies [][]byte, n int) []time.Duration {
	return loadWith(b, url, bodies, n, false)
}

// loadWith optionally speaks h2c (HTTP/2 without TLS), as a proxy with an
// HTTP/2 upstream cluster does: the 50 clients then share connections.
func loadWith(b *testing.B, url string, bodies [][]byte, n int, h2c bool) []time.Duration {
	tr := &http.Transport{MaxIdleConnsPerHost: benchClients * 2, DisableCompression: true}
	if h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var next atomic.Int64
	lat := make([][]time.Duration, benchClients)
	var wg sync.WaitGroup
	var failed atomic.Value
	for g := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, n/benchClients+1)
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					break
				}
				t0 := time.Now()
				resp, err := c.Post(url, "application/json", bytes.NewReader(bodies[i%benchUsers]))
				if err != nil {
					failed.Store(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(t0))
				if resp.StatusCode != 200 || !bytes.HasPrefix(body, []byte(`{"allowed":true`)) {
					failed.Store(fmt.Errorf("status %d: %s", resp.StatusCode, body))
					return
				}
			}
			lat[g] = mine
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return all
}

func pct(l []time.Duration, p float64) float64 {
	if len(l) == 0 {
		return 0
	}
	return float64(l[int(float64(len(l)-1)*p)].Microseconds())
}

// commandStats returns calls per command from INFO commandstats, and the
// microseconds Redis spent in them under "<name>.usec".
func commandStats(b *testing.B, c *redis.Client) map[string]int64 {
	st, err := redistest.CommandStats(c.Options().Addr)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

func redisCPU(b *testing.B, c *redis.Client) float64 {
	info := c.Info(context.Background(), "cpu").Val()
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return total
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds the figures every check benchmark shares.
func report(b *testing.B, elapsed time.Duration, lat []time.Duration, c *redis.Client, before map[string]int64, redisCPU0 float64) {
	n := float64(len(lat))
	b.ReportMetric(n/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(pct(lat, 0.50), "p50-µs")
	b.ReportMetric(pct(lat, 0.99), "p99-µs")
	after := commandStats(b, c)
	// commandstats also counts the commands scripts run; leave those out.
	inScript := map[string]bool{"info": true, "time": true, "hmget": true, "hset": true, "pexpire": true, "zcount": true,
		"zadd": true, "zremrangebyscore": true, "zrange": true, "zrangebyscore": true, "get": true, "set": true, "zcard": true, "zremrangebyrank": true}
	var cmds, all int64
	for k, v := range after {
		if !strings.HasSuffix(k, ".usec") && k != "info" {
			all += v - before[k]
			if !inScript[k] {
				cmds += v - before[k]
			}
		}
	}
	b.ReportMetric(float64(all)/n, "redis-cmds/decision")
	b.ReportMetric(float64(after["evalsha"]-before["evalsha"])/n, "evalsha/decision")
	if calls := after["evalsha"] - before["evalsha"]; calls > 0 {
		// Time inside the script (commandstats), without Redis's network I/O.
		b.ReportMetric(float64(after["evalsha.usec"]-before["evalsha.usec"])/float64(calls), "redis-µs/evalsha")
	}
	b.ReportMetric(float64(cmds)/n, "client-cmds/decision")
	b.ReportMetric((redisCPU(b, c)-redisCPU0)*1e6/n, "redis-cpu-µs/decision")
}

// BenchmarkServer_Check drives the bridge's HTTP handler over loopback, in
// this process, against a local redis-server. cpu-µs/decision counts the
// whole test process: bridge and the 50 clients.
func BenchmarkServer_Check(b *testing.B) {
	rs := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	set := DefaultSettings()
	set.Store, set.RedisURL, set.Logger = "redis", rs.URL, slog.New(slog.DiscardHandler)
	set.AuditLog = filepath.Join(b.TempDir(), "audit")
	s, err := New(set)
	if err != nil {
		b.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	defer func() { s.Shutdown(context.Background()); s.Close() }()
	url := "http://" + ln.Addr().String() + "/v1/rate-limit/check"
	for _, alg := range benchAlgs {
		bodies := benchBodies(alg)
		b.Run(alg.String(), func(b *testing.B) {
			load(b, url, bodies, benchUsers) // warm up: connections, script, keys
			before, rcpu, cpu0 := commandStats(b, rc), redisCPU(b, rc), processCPU()
			b.ResetTimer()
			t0 := time.Now()
			lat := load(b, url, bodies, max(b.N, benchClients))
			elapsed := time.Since(t0)
			b.StopTimer()
			report(b, elapsed, lat, rc, before, rcpu)
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(len(lat)), "cpu-µs/decision")
		})
	}
	// Bytes per counter, one key per algorithm.
	for _, alg := range benchAlgs {
		key := string(rules.AppendKey(nil, "api"+alg.String(), rules.Scope(rules.ScopeUser), &rules.Identity{User: "u1"}, rules.AnonymousIP, "", ""))
		suffix := map[rules.Algorithm]string{rules.TokenBucket: ":tb", rules.SlidingWindow: ":sw", rules.SlidingLog: ":sl", rules.FixedWindow: ":fw"}[alg]
		if n, err := rc.MemoryUsage(context.Background(), key+suffix).Result(); err == nil {
			b.Logf("MEMORY USAGE %s%s = %d bytes", key, suffix, n)
		}
	}
}

// BenchmarkBridgeProcess_Check runs cmd/redisbridge as its own process so
// its CPU time per decision can be read apart from the load generator's.
// The HTTP/1.1 load comes from internal/loadgen (raw keep-alive
// connections, cheap per request); the h2c case uses net/http's client.
//
//	go test -run '^$' -bench BridgeProcess -benchtime 200000x ./redisbridge
func BenchmarkBridgeProcess_Check(b *testing.B) {
	rs := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	var debug string
	// A generous Redis timeout: the benchmark measures throughput on a
	// machine it shares with its own load generator, not failure handling.
	// -bridge.flags come later and win.
	args := append([]string{"--redis-timeout", "1s"}, strings.Fields(*bridgeFlags)...)
	if *bridgeProfile != "" {
		debug = nettest.FreeAddr(b)
		args = append(args, "--debug-listen", debug)
	}
	addr, pid := startBridgeProcess(b, rs.URL, args...)
	for _, tc := range []struct {
		alg rules.Algorithm
		h2c bool
	}{{rules.TokenBucket, false}, {rules.SlidingWindow, false}, {rules.FixedWindow, false}, {rules.TokenBucket, true}} {
		bodies := benchBodies(tc.alg)
		name := tc.alg.String()
		if tc.h2c {
			name += "/h2c"
		}
		b.Run(name, func(b *testing.B) {
			n := max(b.N, benchClients)
			run := func(n int) []time.Duration {
				o := loadgen.Options{Addr: addr, Path: "/v1/rate-limit/check", Bodies: bodies, Conns: benchClients, N: n, Check: allowedAnswer}
				if tc.h2c {
					o.H2C, o.Conns, o.Streams = true, benchH2Conns, benchClients/benchH2Conns
				}
				res, err := loadgen.Run(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				return res.Latencies
			}
			run(benchUsers) // warm up: connections, script, keys
			before, rcpu, cpu0, self0 := commandStats(b, rc), redisCPU(b, rc), childCPU(b, pid), processCPU()
			sys0 := childSyscalls(pid)
			var prof sync.WaitGroup
			if debug != "" {
				prof.Go(func() { saveProfile(b, debug, *bridgeProfile+"."+strings.ReplaceAll(name, "/", "_")) })
			}
			b.ResetTimer()
			t0 := time.Now()
			lat := run(n)
			elapsed := time.Since(t0)
			b.StopTimer()
			prof.Wait()
			report(b, elapsed, lat, rc, before, rcpu)
			d := float64(len(lat))
			b.ReportMetric(float64((childCPU(b, pid)-cpu0).Microseconds())/d, "bridge-cpu-µs/decision")
			if sys0 >= 0 {
				b.ReportMetric(float64(childSyscalls(pid)-sys0)/d, "bridge-rw-syscalls/decision")
			}
			b.ReportMetric(float64((processCPU()-self0).Microseconds())/d, "loader-cpu-µs/decision")
		})
	}
}

// BenchmarkBridgeProcess_HotKey is one hot key at high concurrency: 200
// connections, every check on one counter (fixed window, token bucket,
// each allowed), against the bridge as a process with --redis-batch 1 (a
// script call per check) and with its default batching, where the checks
// of one key that queue while a pipeline is busy are decided in one
// script call, the key's HASH read and written once per call.
// redis-cmds/decision counts every command Redis ran, those inside
// scripts included.
func BenchmarkBridgeProcess_HotKey(b *testing.B) {
	rs := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	for _, batch := range []string{"1", "128"} {
		addr, _ := startBridgeProcess(b, rs.URL, "--redis-timeout", "1s", "--redis-batch", batch)
		for _, alg := range []rules.Algorithm{rules.FixedWindow, rules.TokenBucket} {
			l := rules.LimitRequest{Key: "rl:{g}:hot-" + alg.String(), Rule: "hot",
				Spec: rules.LimitSpec{Algorithm: alg, Limit: 1 << 40, WindowMS: 3_600_000, Burst: 1 << 40, Cost: 1}}
			bodies := [][]byte{rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{Limits: []rules.LimitRequest{l}})}
			b.Run("batch-"+batch+"/"+alg.String(), func(b *testing.B) {
				n := max(b.N, 2000)
				o := loadgen.Options{Addr: addr, Path: "/v1/rate-limit/check", Bodies: bodies, Conns: 200, Check: allowedAnswer}
				o.N = 2000
				if _, err := loadgen.Run(context.Background(), o); err != nil { // warm up
					b.Fatal(err)
				}
				before, rcpu := commandStats(b, rc), redisCPU(b, rc)
				b.ResetTimer()
				o.N = n
				t0 := time.Now()
				res, err := loadgen.Run(context.Background(), o)
				elapsed := time.Since(t0)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				report(b, elapsed, res.Latencies, rc, before, rcpu)
			})
		}
	}
}

var bridgeFlags = flag.String("bridge.flags", "", "BenchmarkBridgeProcess_Check: extra flags for the bridge, space-separated")

var bridgeProfile = flag.String("bridge.cpuprofile", "",
	"BenchmarkBridgeProcess_Check: write a 3s CPU profile of the bridge process, taken at the start of each case, to this path + \".<case>\"")

// saveProfile fetches a CPU profile from the bridge's --debug-listen.
func saveProfile(b *testing.B, debug, path string) {
	resp, err := http.Get("http://" + debug + "/debug/pprof/profile?seconds=3")
	if err != nil {
		b.Error(err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		b.Error(err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		b.Error(err)
	}
}

// allowedAnswer accepts 200 answers that allow the request.
func allowedAnswer(status int, body []byte) error {
	if status != 200 || !bytes.HasPrefix(body, []byte(`{"allowed":true`)) {
		return fmt.Errorf("status %d: %s", status, body)
	}
	return nil
}

// startBridgeProcess builds and starts cmd/redisbridge against redisURL and
// returns its address and pid; it is stopped when b ends.
func startBridgeProcess(b *testing.B, redisURL string, args ...string) (string, int) {
	bin := filepath.Join(b.TempDir(), "redisbridge")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/redisbridge").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	addr := nettest.FreeAddr(b)
	cmd := exec.Command(bin, append([]string{"--listen", addr, "--store", "redis", "--redis-url", redisURL, "--log-level", "error"}, args...)...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "listening on ") {
	}
	go io.Copy(io.Discard, stderr)
	return addr, cmd.Process.Pid
}

// childSyscalls is how many read and write system calls pid made
// (syscr + syscw of /proc/pid/io), -1 if unknown.
func childSyscalls(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return -1
	}
	var n int64
	for _, line := range strings.Split(string(raw), "\n") {
		for _, f := range []string{"syscr: ", "syscw: "} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
		}
	}
	return n
}

// childCPU reads utime+stime of pid from /proc (clock ticks of 10ms).
func childCPU(b *testing.B, pid int) time.Duration {
	d, err := proccpu.Of(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkRedisBenchmark_EvalSHA runs redis-benchmark with the same check
// script, 50 clients, one command at a time (-P 1), on 10,000 keys: the
// ceiling Redis itself sets for the bridge on this machine.
func BenchmarkRedisBenchmark_EvalSHA(b *testing.B) {
	rs := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	if err := rc.ScriptLoad(context.Background(), store.CheckScript()).Err(); err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 200_000)
	before, rcpu := commandStats(b, rc), redisCPU(b, rc)
	b.ResetTimer()
	rps := redisBenchmark(b, rs.Addr, n, false)
	b.StopTimer()
	after := commandStats(b, rc)
	if calls := after["evalsha"] - before["evalsha"]; calls > 0 {
		b.ReportMetric(float64(after["evalsha.usec"]-before["evalsha.usec"])/float64(calls), "redis-µs/evalsha")
		b.ReportMetric((redisCPU(b, rc)-rcpu)*1e6/float64(calls), "redis-cpu-µs/evalsha")
	}
	b.ReportMetric(rps, "evalsha/s")
}

// redisBenchmark runs redis-benchmark against the Redis at addr: 50
// clients, one command at a time (-P 1), n EVALSHAs of the check script
// deciding one token bucket limit, as the bridge sends it, of 10,000 users
// (one user when hot). It returns the EVALSHAs per second. The script
// must be loaded.
func redisBenchmark(b *testing.B, addr string, n int, hot bool) float64 {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		b.Fatalf("redis-benchmark not installed (Debian package redis-tools): %v", err)
	}
	_, port, _ := net.SplitHostPort(addr)
	key := "rl:{u:__rand_int__}:bench"
	args := []string{"-h", "127.0.0.1", "-p", port, "-n", strconv.Itoa(n), "-c", "50", "-P", "1", "-r", "10000", "--csv"}
	if hot {
		key = "rl:{u:hot}:bench"
	}
	cmd := store.CheckCommand([]rules.LimitRequest{{Key: key,
		Spec: rules.LimitSpec{Algorithm: rules.TokenBucket, Limit: 1 << 30, WindowMS: 60_000, Burst: 1 << 30, Cost: 1}}})
	out, err := exec.Command("redis-benchmark", append(args, cmd...)...).CombinedOutput()
	if err != nil {
		b.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	// CSV: "test","rps","avg_latency_ms",...
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) > 1 && strings.Contains(f[0], "EVALSHA") {
			rps, _ := strconv.ParseFloat(strings.Trim(f[1], `"`), 64)
			return rps
		}
	}
	b.Fatalf("no EVALSHA line in redis-benchmark output:\n%s", out)
	return 0
}

// BenchmarkMemory_Check is the memory store's hot path, no HTTP.
func BenchmarkMemory_Check(b *testing.B) {
	m := store.NewMemory(store.MemoryOptions{})
	bodies := benchBodies(rules.SlidingWindow)
	reqs := make([]rules.CheckRequest, 200)
	for i := range reqs {
		var err error
		if reqs[i], err = rules.DecodeCheckRequest(bodies[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var resp rules.CheckResponse
		i := 0
		for pb.Next() {
			req := reqs[i%200]
			if err := m.Check(context.Background(), time.Time{}, &req, &resp); err != nil || !resp.Allowed {
				b.Fatal(err)
			}
			i++
		}
	})
}
