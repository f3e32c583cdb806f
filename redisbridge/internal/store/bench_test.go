package store

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkRedis_Check is the store's hot path without HTTP: 50 goroutines
// checking 10,000 users against a local redis-server. cpu-µs/check is this
// process's CPU (the bridge side of a check: batching, RESP, go-redis).
func BenchmarkRedis_Check(b *testing.B) {
	srv := redistest.Start(b)
	for _, tc := range []struct {
		name       string
		viaGoRedis bool
	}{{"direct", false}, {"go-redis", true}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 2 * time.Second, viaGoRedis: tc.viaGoRedis})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchChecks(b, s)
		})
	}
}

func benchChecks(b *testing.B, s *Redis) {
	reqs := make([]rules.CheckRequest, 10_000)
	for i := range reqs {
		reqs[i] = rules.CheckRequest{Limits: []rules.LimitRequest{
			lim("rl:{u:"+strconv.Itoa(i)+"}:bench", spec(rules.TokenBucket, 1<<30, 60_000))}}
	}
	var next atomic.Int64
	b.SetParallelism(25) // 50 goroutines on 2 CPUs
	b.ReportAllocs()
	cpu0 := rusage()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var resp rules.CheckResponse
		for pb.Next() {
			req := reqs[next.Add(1)%int64(len(reqs))]
			if err := s.Check(context.Background(), time.Time{}, &req, &resp); err != nil || !resp.Allowed {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((rusage()-cpu0).Microseconds())/float64(b.N), "cpu-µs/check")
}

func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMemory_Check is the embedded store's check of a returning
// user's token bucket, the path of every call-out a gateway with the
// bridge embedded answers: it allocates only the name it looks the bucket
// up by (the limit's key and its algorithm's suffix).
func BenchmarkMemory_Check(b *testing.B) {
	s := NewMemory(MemoryOptions{})
	req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:1}:bench", spec(rules.TokenBucket, 1<<30, 60_000))}}
	var resp rules.CheckResponse
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Check(context.Background(), time.Time{}, &req, &resp); err != nil || !resp.Allowed {
			b.Fatal(err)
		}
	}
}
