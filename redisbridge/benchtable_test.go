package redisbridge

import (
	"context"
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/benchtable"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/redisbridge/internal/rls"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

var (
	tableRounds    = flag.Int("bench.rounds", 5, "BenchmarkBridgeTable: rounds of every row, interleaved; the table has their medians")
	tableRatelimit = flag.Bool("bench.ratelimit", true, "BenchmarkBridgeTable: add envoyproxy/ratelimit's rows (built from the Go module proxy), the same calls on the same Redis")
)

// tableRow is one way of deciding checks that BenchmarkBridgeTable
// measures.
type tableRow struct {
	name   string
	note   string
	base   bool
	hot    bool   // one key for every check (else 10,000 users)
	bridge string // "" for redis-benchmark, else "h1" or "h2c"
	batch1 bool   // the bridge with --redis-batch 1
	rls    bool   // Envoy's rate limit service's calls (gRPC), not the plugin's checks
	// ratelimit: envoyproxy/ratelimit answers the rate limit service's
	// calls, with these variables of its own (bridge "h2c", rls).
	ratelimit []string
}

// tableFigures is what one run of a row measured.
type tableFigures struct {
	rate, p99ms, bridgeCPU, redisCPU, evalsha, cmds float64
}

// BenchmarkBridgeTable is the bridge's part of the table `make bench`
// prints: in one run, against one redis-server, redis-benchmark calling
// the check script directly and the bridge as a process (HTTP/1.1 and
// h2c; batched script calls, and one per check as before --redis-batch),
// for 10,000 users and for one hot key, every row run -bench.rounds times,
// interleaved, and reported as the medians. The load: 50 checks in flight
// (50 HTTP/1.1 connections; 2 h2c connections of 25 streams each, as a
// 2-worker proxy), one token bucket limit per check, every check allowed.
//
//	go test -run '^$' -bench BridgeTable -benchtime 200000x ./redisbridge
//
// It prints its table, or, with $SLUICE_BENCH_TABLE set, appends the rows
// there for internal/benchtable to print with the other parts.
func BenchmarkBridgeTable(b *testing.B) {
	if b.N == 1 {
		return // the probe run of -benchtime Nx
	}
	n := b.N
	rs := redistest.Start(b)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	if err := rc.ScriptLoad(context.Background(), store.CheckScript()).Err(); err != nil {
		b.Fatal(err)
	}
	// A generous Redis timeout: throughput is measured, on a machine the
	// load generator shares, not failure handling.
	flags := strings.Fields(*bridgeFlags) // -bridge.flags, for both bridges
	rlsConfig := rlsConfig(b, rlsConfigYAML)
	addr, pid := startBridgeProcess(b, rs.URL, append([]string{"--redis-timeout", "1s", "--rls-config", rlsConfig}, flags...)...)
	addr1, pid1 := startBridgeProcess(b, rs.URL, append([]string{"--redis-timeout", "1s", "--redis-batch", "1"}, flags...)...)
	users := benchBodies(rules.TokenBucket)
	hotKey := [][]byte{users[0]}
	rlsUsers := rlsBodies(b)
	const (
		group    = "Bridge: 50 checks in flight, 10,000 users, one token bucket limit, all allowed"
		hotGroup = "Bridge: 50 checks in flight, one hot key"
		h2cNote  = "h2c: 2 connections × 25 streams, as a proxy with 2 workers; HTTP/1.1: 50 keep-alive connections"
	)
	rows := []tableRow{
		{name: "redis-benchmark -c 50 -P 1, EVALSHA of one check", base: true},
		{name: "bridge, HTTP/1.1", bridge: "h1"},
		{name: "bridge, h2c", bridge: "h2c", note: h2cNote},
		{name: "bridge, h2c, --redis-batch 1 (a script call per check)", bridge: "h2c", batch1: true},
		{name: "bridge, h2c, Envoy's rate limit service (gRPC ShouldRateLimit, a descriptor per user, fixed window)", bridge: "h2c", rls: true},
	}
	var ratelimitBin string
	if *tableRatelimit {
		ratelimitBin = envoyRatelimitBinary(b)
		// The service users would otherwise run, on the same Redis with
		// the same configuration and calls: as it starts by default, and
		// with the write buffering its README advises for throughput.
		note := "envoyproxy/ratelimit " + moduleVersion(b, ratelimitBin) + " (its service_cmd, Redis INCRBY and EXPIRE pipelined per call); the bridge CPU column is its process's"
		rows = append(rows,
			tableRow{name: "envoyproxy/ratelimit, the same calls, its defaults", bridge: "h2c", rls: true, ratelimit: []string{}, note: note},
			tableRow{name: "envoyproxy/ratelimit, the same calls, REDIS_PIPELINE_WINDOW=150us", bridge: "h2c", rls: true, ratelimit: []string{"REDIS_PIPELINE_WINDOW=150us"}})
	}
	rows = append(rows, []tableRow{
		{name: "redis-benchmark, one key", base: true, hot: true},
		{name: "bridge, h2c, one key", bridge: "h2c", hot: true},
		{name: "bridge, h2c, one key, --redis-batch 1", bridge: "h2c", hot: true, batch1: true},
	}...)
	services := make([]envoyRatelimitProcess, len(rows)) // by row
	for i, r := range rows {
		if r.ratelimit != nil {
			services[i] = startEnvoyRatelimit(b, ratelimitBin, rs.Addr, map[string]string{"config.yaml": rlsConfigYAML}, r.ratelimit...)
		}
	}
	runs := make([][]tableFigures, len(rows))
	b.ResetTimer()
	for round := range *tableRounds {
		for i, r := range rows {
			bodies, a, p := users, addr, pid
			if r.hot {
				bodies = hotKey
			}
			if r.rls {
				bodies = rlsUsers
			}
			if r.batch1 {
				a, p = addr1, pid1
			}
			if r.ratelimit != nil {
				a, p = services[i].grpc, services[i].pid
			}
			if round == 0 && r.bridge != "" {
				loadBridge(b, a, r, bodies, benchUsers) // connections, keys
			}
			runs[i] = append(runs[i], measureRow(b, rc, r, a, p, bodies, n))
		}
	}
	b.StopTimer()
	var out []benchtable.Row
	for i, r := range rows {
		med := func(f func(tableFigures) float64) float64 { return benchtable.Median(runs[i], f) }
		g := group
		if r.hot {
			g = hotGroup
		}
		row := benchtable.Row{Group: g, Name: r.name, Base: r.base, Note: r.note, Metrics: []benchtable.Metric{
			{Name: "decisions/s", Value: med(func(f tableFigures) float64 { return f.rate }), Ratio: true},
		}}
		if r.bridge != "" {
			row.Metrics = append(row.Metrics,
				benchtable.Metric{Name: "p99 ms", Value: med(func(f tableFigures) float64 { return f.p99ms })},
				benchtable.Metric{Name: "bridge CPU µs/decision", Value: med(func(f tableFigures) float64 { return f.bridgeCPU })})
		}
		row.Metrics = append(row.Metrics,
			benchtable.Metric{Name: "Redis CPU µs/decision", Value: med(func(f tableFigures) float64 { return f.redisCPU }), Ratio: true},
			benchtable.Metric{Name: "EVALSHA/decision", Value: med(func(f tableFigures) float64 { return f.evalsha })},
			benchtable.Metric{Name: "Redis commands/decision", Value: med(func(f tableFigures) float64 { return f.cmds }), Ratio: true})
		out = append(out, row)
		b.Logf("%s: %v", r.name, runs[i])
	}
	for i := range out {
		out[i].Group += fmt.Sprintf(" (medians of %d rounds of %d checks, interleaved)", *tableRounds, n)
	}
	if os.Getenv(benchtable.Env) == "" {
		var sb strings.Builder
		benchtable.Print(&sb, out)
		fmt.Fprintf(os.Stdout, "\n%s\n", sb.String())
	} else if err := benchtable.Append(out...); err != nil {
		b.Fatal(err)
	}
}

// rlsConfigYAML configures the rate limit service rows, the bridge's and
// envoyproxy/ratelimit's: a limit no call reaches for each user.
const rlsConfigYAML = "domain: bench\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 1073741824}}]"

// moduleVersion is the version of the module bin was built from.
func moduleVersion(b *testing.B, bin string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		b.Fatal(err)
	}
	return info.Main.Version
}

// loadBridge sends n of row r's checks (or calls) to the bridge at addr
// and returns what the load generator measured.
func loadBridge(b *testing.B, addr string, r tableRow, bodies [][]byte, n int) loadgen.Result {
	o := loadgen.Options{Addr: addr, Path: "/v1/rate-limit/check", Bodies: bodies, Conns: benchClients, N: n, Check: allowedAnswer}
	if r.bridge == "h2c" {
		o.H2C, o.Conns, o.Streams = true, benchH2Conns, benchClients/benchH2Conns
	}
	if r.rls {
		o.Path, o.ContentType, o.Check = rlsPath, "application/grpc", rlsAllowed
	}
	res, err := loadgen.Run(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	return res
}

// measureRow runs row r once: n checks.
func measureRow(b *testing.B, rc *redis.Client, r tableRow, addr string, pid int, bodies [][]byte, n int) tableFigures {
	before, rcpu := commandStats(b, rc), redisCPU(b, rc)
	var f tableFigures
	var cpu0 time.Duration
	if r.bridge == "" {
		f.rate = redisBenchmark(b, rc.Options().Addr, n, r.hot)
	} else {
		cpu0 = childCPU(b, pid)
		res := loadBridge(b, addr, r, bodies, n)
		f.rate, f.p99ms = res.Rate(), float64(res.Percentile(0.99).Microseconds())/1000
		f.bridgeCPU = float64((childCPU(b, pid) - cpu0).Microseconds()) / float64(n)
	}
	after := commandStats(b, rc)
	f.redisCPU = (redisCPU(b, rc) - rcpu) * 1e6 / float64(n)
	f.evalsha = float64(after["evalsha"]-before["evalsha"]) / float64(n)
	var cmds int64
	for k, v := range after {
		switch {
		case strings.HasSuffix(k, ".usec"), k == "info", strings.HasPrefix(k, "config"), k == "ping", k == "script|load":
		default:
			cmds += v - before[k]
		}
	}
	f.cmds = float64(cmds) / float64(n)
	return f
}

// rlsBodies are ShouldRateLimit calls, as gRPC messages: a descriptor
// user=uN for each of the users.
func rlsBodies(b *testing.B) [][]byte {
	bodies := make([][]byte, benchUsers)
	for i := range bodies {
		bodies[i] = rlsFrame(&rlsv3.RateLimitRequest{Domain: "bench",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "u"+strconv.Itoa(i))}})
	}
	return bodies
}

// rlsAllowed accepts a ShouldRateLimit answer whose overall code is OK:
// the message's first field (AppendResponse writes it first).
func rlsAllowed(status int, body []byte) error {
	if status != 200 || len(body) < 7 || body[0] != 0 || body[5] != 0x08 || body[6] != byte(rls.CodeOK) {
		return fmt.Errorf("status %d: %x", status, body)
	}
	return nil
}
