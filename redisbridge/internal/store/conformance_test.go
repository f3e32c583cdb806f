package store

import (
	"context"
	"crypto/tls"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// harness runs one store for the conformance suite, on a clock that only
// moves on sleep: the memory store's injected clock, check.lua's time
// argument in test builds (clockScript).
type harness struct {
	name  string
	s     Store
	now   *atomic.Int64 // the clock, in unix ms
	sleep func(ms int64)
	// keys lists every stored key with its remaining time to live in ms.
	keys func(t *testing.T) map[string]int64
}

func memoryHarness() *harness {
	now := fakeNow()
	m := NewMemory(MemoryOptions{Now: now.Load})
	return &harness{
		name: "memory", s: m, now: now,
		sleep: func(ms int64) { now.Add(ms) },
		keys: func(t *testing.T) map[string]int64 {
			out := map[string]int64{}
			for i := range m.shards {
				for k, e := range m.shards[i].m {
					out[k] = e.expireAt - now.Load()
				}
			}
			return out
		},
	}
}

func redisHarness(t *testing.T, split bool) *harness {
	srv := redistest.Start(t)
	now := fakeNow()
	// "redis" sends checks on the store's own connections (direct.go),
	// "redis-split" through go-redis, as for Cluster: the suite covers both.
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 5 * time.Second, splitSlots: split, viaGoRedis: split,
		script: clockScript(t, now.Load)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	name := "redis"
	if split {
		name = "redis-split"
	}
	return &harness{
		name: name, s: s, now: now,
		sleep: func(ms int64) { now.Add(ms) },
		keys: func(t *testing.T) map[string]int64 {
			ctx := context.Background()
			out := map[string]int64{}
			for _, k := range s.c.Keys(ctx, "*").Val() {
				out[k] = s.c.PTTL(ctx, k).Val().Milliseconds()
			}
			return out
		},
	}
}

func harnesses(t *testing.T) []*harness {
	return []*harness{memoryHarness(), redisHarness(t, false), redisHarness(t, true)}
}

func spec(alg rules.Algorithm, limit, windowMS int64) rules.LimitSpec {
	return rules.LimitSpec{Algorithm: alg, Limit: limit, WindowMS: windowMS, Burst: limit, Cost: 1}
}

func lim(key string, s rules.LimitSpec) rules.LimitRequest {
	return rules.LimitRequest{Key: key, Rule: "r", Spec: s}
}

func (h *harness) check(t *testing.T, ls ...rules.LimitRequest) rules.CheckResponse {
	t.Helper()
	return h.checkAs(t, "", "", ls...)
}

func (h *harness) checkAs(t *testing.T, user, endpoint string, ls ...rules.LimitRequest) rules.CheckResponse {
	t.Helper()
	req := rules.CheckRequest{User: user, Endpoint: endpoint, Limits: append([]rules.LimitRequest(nil), ls...)}
	var resp rules.CheckResponse
	if err := h.s.Check(context.Background(), time.Time{}, &req, &resp); err != nil {
		t.Fatalf("%s: check: %v", h.name, err)
	}
	if len(resp.Decisions) != len(ls) {
		t.Fatalf("%s: %d decisions for %d limits", h.name, len(resp.Decisions), len(ls))
	}
	return resp
}

var algs = []rules.Algorithm{rules.TokenBucket, rules.SlidingWindow, rules.SlidingLog, rules.FixedWindow}

const hour = 3_600_000

func TestStore_CountsUntilLimit(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				l := lim("rl:{u:count}:"+alg.String(), spec(alg, 3, hour))
				for i, wantRem := range []int64{2, 1, 0} {
					r := h.check(t, l)
					d := r.Decisions[0]
					if !r.Allowed || !d.Allowed || d.Remaining != wantRem || d.Limit != 3 || d.RetryAfterMS != 0 {
						t.Fatalf("check %d: %+v allowed=%v, want allowed remaining %d", i, d, r.Allowed, wantRem)
					}
				}
				r := h.check(t, l)
				d := r.Decisions[0]
				if r.Allowed || d.Allowed || d.Remaining != 0 || d.RetryAfterMS <= 0 || d.ResetMS <= r.NowMS {
					t.Fatalf("4th check: %+v allowed=%v, want denied with retry and reset", d, r.Allowed)
				}
				// Algorithm-specific waits, from the store's own clock.
				switch alg {
				case rules.TokenBucket: // one token per hour/3
					if d.RetryAfterMS != hour/3 || d.ResetMS-r.NowMS != hour {
						t.Errorf("token bucket: retry %d reset in %d, want %d and %d", d.RetryAfterMS, d.ResetMS-r.NowMS, hour/3, hour)
					}
				case rules.SlidingLog: // the oldest entry leaves the window
					if d.RetryAfterMS != hour {
						t.Errorf("sliding log: retry %d, want %d", d.RetryAfterMS, hour)
					}
				case rules.FixedWindow: // the window ends
					if end := (r.NowMS/hour + 1) * hour; d.RetryAfterMS != end-r.NowMS || d.ResetMS != end {
						t.Errorf("fixed window: retry %d reset %d, want %d and %d", d.RetryAfterMS, d.ResetMS, end-r.NowMS, end)
					}
				case rules.SlidingWindow: // next window, when 3 × weight + 1 <= 3
					start := (r.NowMS/hour + 1) * hour
					if want := start - r.NowMS + hour/3; d.RetryAfterMS != want {
						t.Errorf("sliding window: retry %d, want %d", d.RetryAfterMS, want)
					}
					if d.ResetMS != start+hour {
						t.Errorf("sliding window: reset %d, want %d", d.ResetMS, start+hour)
					}
				}
			})
		}
	}
}

func TestStore_Cost(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				s := spec(alg, 10, hour)
				s.Cost = 4
				l := lim("rl:{u:cost}:"+alg.String(), s)
				for i, want := range []struct {
					ok  bool
					rem int64
				}{{true, 6}, {true, 2}, {false, 2}} {
					d := h.check(t, l).Decisions[0]
					if d.Allowed != want.ok || d.Remaining != want.rem {
						t.Fatalf("check %d: %+v, want allowed=%v remaining=%d", i, d, want.ok, want.rem)
					}
				}
				// A cost above the limit never passes: retry a whole window.
				s.Cost = 11
				r := h.check(t, lim("rl:{u:cost}:big"+alg.String(), s))
				if d := r.Decisions[0]; r.Allowed || d.Allowed || d.RetryAfterMS != hour {
					t.Fatalf("cost > limit: %+v, want denied with retry %d", d, hour)
				}
			})
		}
	}
}

// A fill limit takes what it has left when a check costs more, allows
// while it has anything, and says what it had (LimitRequest.Fill).
func TestStore_Fill(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				l := lim("rl:{u:fill}:"+alg.String(), spec(alg, 5, hour))
				l.Fill = true
				for i, step := range []struct {
					cost      int64
					ok        bool
					had, took int64
				}{
					{3, true, 5, 3},
					{0, true, 2, 0}, // a peek
					{3, true, 2, 2}, // what is left
					{0, false, 0, 0},
					{1, false, 0, 0},
				} {
					l.Spec.Cost = step.cost
					r := h.check(t, l)
					d := r.Decisions[0]
					if r.Allowed != step.ok || d.Allowed != step.ok || d.Remaining != step.had || l.Taken(&d) != step.took || d.Limit != 5 {
						t.Fatalf("check %d at cost %d: %+v allowed=%v, want allowed=%v remaining %d taking %d",
							i, step.cost, d, r.Allowed, step.ok, step.had, step.took)
					}
					if !step.ok && (d.RetryAfterMS <= 0 || d.RetryAfterMS > hour) {
						t.Fatalf("check %d: retry after %d ms, want within the hour", i, d.RetryAfterMS)
					}
				}
			})
		}
		// Refused by another limit, a fill limit takes nothing (on
		// redis-split, two slots: the one that took is refunded what it
		// took, not the cost asked).
		t.Run(h.name+"/refused", func(t *testing.T) {
			for _, keyB := range []string{"rl:{u:fillr}:b", "rl:{u:fillr2}:b"} {
				a := lim("rl:{u:fillr}:a"+keyB, spec(rules.FixedWindow, 1, hour))
				b := lim(keyB, spec(rules.FixedWindow, 4, hour))
				b.Fill, b.Spec.Cost = true, 3
				if r := h.check(t, a, b); !r.Allowed || r.Decisions[1].Remaining != 4 {
					t.Fatalf("first check: %+v, want allowed, the fill limit having had 4", r)
				}
				b.Spec.Cost = 100
				r := h.check(t, a, b)
				if r.Allowed || r.Decisions[0].Allowed || !r.Decisions[1].Allowed || r.Decisions[1].Remaining != 1 {
					t.Fatalf("second check: %+v, want denied by the first limit, the fill limit having 1", r)
				}
				b.Spec.Cost = 1
				if r := h.check(t, b); !r.Allowed || r.Decisions[0].Remaining != 1 {
					t.Fatalf("third check: %+v, want allowed, having 1", r.Decisions)
				}
			}
		})
	}
}

// Quota limits deny a check only all together; one that denies takes
// nothing (LimitRequest.Quota).
func TestStore_Quota(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			// On redis-split, the second round's b is in a slot of its
			// own: the check is decided in Go, and refunded.
			for _, tagB := range []string{"{u:quota}", "{u:quota2}"} {
				a := lim("rl:{u:quota}:a"+tagB, spec(rules.FixedWindow, 1, hour))
				b := lim("rl:"+tagB+":b", spec(rules.FixedWindow, 2, hour))
				c := lim("rl:{u:quota}:c"+tagB, spec(rules.FixedWindow, 5, hour))
				a.Quota, b.Quota = true, true
				type want struct {
					allowed bool
					ok      [3]bool
					rem     [3]int64
				}
				for i, w := range []want{
					{true, [3]bool{true, true, true}, [3]int64{0, 1, 4}},    // both quotas allow, both take
					{true, [3]bool{false, true, true}, [3]int64{0, 0, 3}},   // a is spent: b lets it pass
					{false, [3]bool{false, false, true}, [3]int64{0, 0, 2}}, // both spent: refused
				} {
					r := h.check(t, a, b, c)
					got := want{allowed: r.Allowed}
					for j, d := range r.Decisions {
						got.ok[j], got.rem[j] = d.Allowed, d.Remaining
					}
					if got != w {
						t.Fatalf("check %d: %+v, want %+v", i, got, w)
					}
				}
				if d := h.check(t, c).Decisions[0]; d.Remaining != 2 {
					t.Fatalf("c has %d left after taking one, want 2: the refused check took from it", d.Remaining)
				}
			}
		})
	}
}

func TestStore_AllOrNothing(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			// Different hash tags: on redis-split these are two slots, and
			// the allowed slot is refunded when the other denies.
			for _, keyB := range []string{"rl:{u:aon}:b", "rl:{u:aon2}:b"} {
				a := lim("rl:{u:aon}:a"+keyB, spec(rules.FixedWindow, 1, hour))
				b := lim(keyB, spec(rules.TokenBucket, 5, hour))
				c := lim(keyB+"log", spec(rules.SlidingLog, 5, hour))
				if r := h.check(t, a, b, c); !r.Allowed {
					t.Fatalf("first check denied: %+v", r)
				}
				r := h.check(t, a, b, c)
				if r.Allowed || r.Decisions[0].Allowed || !r.Decisions[1].Allowed || !r.Decisions[2].Allowed {
					t.Fatalf("second check: %+v, want denied by the first limit only", r)
				}
				if r.Decisions[1].Remaining != 3 || r.Decisions[2].Remaining != 3 {
					t.Fatalf("second check: remaining %d %d, want 3 3 (as if consumed)", r.Decisions[1].Remaining, r.Decisions[2].Remaining)
				}
				// Nothing of the denied check was consumed.
				r = h.check(t, b, c)
				if !r.Allowed || r.Decisions[0].Remaining != 3 || r.Decisions[1].Remaining != 3 {
					t.Fatalf("third check: %+v, want remaining 3 3", r.Decisions)
				}
			}
		})
	}
}

func TestStore_LogOnly(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			sh := lim("rl:{u:sh}:logonly", spec(rules.FixedWindow, 1, hour))
			sh.LogOnly = true
			sh.Spec.Penalty = &rules.Penalty{Enabled: true, DetectionWindowMS: hour, ViolationThreshold: 1, Multipliers: []int64{1}}
			b := lim("rl:{u:sh}:b", spec(rules.FixedWindow, 5, hour))
			for i := range 3 {
				r := h.check(t, sh, b)
				if !r.Allowed || r.Decisions[0].Allowed != (i == 0) || !r.Decisions[1].Allowed {
					t.Fatalf("check %d: %+v, want allowed, the log-only limit denying after the first", i, r)
				}
			}
			if d := h.check(t, b).Decisions[0]; d.Remaining != 1 {
				t.Fatalf("b remaining %d, want 1: the log-only denials must not stop consumption", d.Remaining)
			}
			// A log-only denial records no violation, so no block either.
			if d := h.check(t, sh).Decisions[0]; d.RetryAfterMS >= hour {
				t.Fatalf("log-only limit got blocked: %+v", d)
			}
		})
	}
}

func TestStore_WindowsPass(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				l := lim("rl:{u:pass}:"+alg.String(), spec(alg, 2, 60_000))
				for range 2 {
					h.check(t, l)
				}
				d := h.check(t, l).Decisions[0]
				if d.Allowed || d.RetryAfterMS <= 0 || d.RetryAfterMS > 120_000 {
					t.Fatalf("third: %+v, want denied with 0 < retry <= 120000", d)
				}
				h.sleep(d.RetryAfterMS - 1)
				if d := h.check(t, l).Decisions[0]; d.Allowed {
					t.Fatalf("1 ms before retry_after: %+v, want denied", d)
				}
				h.sleep(1)
				if d := h.check(t, l).Decisions[0]; !d.Allowed {
					t.Fatalf("after retry_after: %+v, want allowed", d)
				}
			})
		}
	}
}

// TestStore_LimitLowered: a limit lowered while its counter is full (a
// reloaded configuration, a policy change) starts its next window empty:
// a fixed window's count ends with its window, however much it was.
func TestStore_LimitLowered(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				key := "rl:{u:lowered}:" + alg.String()
				for range 10 {
					if d := h.check(t, lim(key, spec(alg, 10, 60_000))).Decisions[0]; !d.Allowed {
						t.Fatalf("within 10: %+v", d)
					}
				}
				h.sleep(120_000) // every algorithm has forgotten the 10 by now
				for i := range 3 {
					if d := h.check(t, lim(key, spec(alg, 3, 60_000))).Decisions[0]; !d.Allowed || d.Remaining != int64(2-i) {
						t.Fatalf("check %d of 3 under the lowered limit: %+v", i+1, d)
					}
				}
				if d := h.check(t, lim(key, spec(alg, 3, 60_000))).Decisions[0]; d.Allowed {
					t.Fatalf("a fourth under the lowered limit: %+v", d)
				}
			})
		}
	}
}

func TestStore_PenaltyEscalates(t *testing.T) {
	const w = 60_000
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			s := spec(rules.FixedWindow, 1, w)
			s.Penalty = &rules.Penalty{Enabled: true, DetectionWindowMS: 10 * hour, ViolationThreshold: 2, Multipliers: []int64{1, 3}}
			l := lim("rl:{u:pen}:x", s)
			r := h.check(t, l)
			if !r.Allowed {
				t.Fatalf("first: %+v", r)
			}
			windowEnd := (r.NowMS/w + 1) * w
			if d := h.check(t, l).Decisions[0]; d.Allowed || d.RetryAfterMS != windowEnd-r.NowMS {
				t.Fatalf("second (1 violation, below threshold): %+v, want retry at the window's end", d)
			}
			h.sleep(1)
			d := h.check(t, l).Decisions[0] // 2 violations: blocked w × 1
			if d.Allowed || d.RetryAfterMS != w || d.ResetMS != r.NowMS+1+w {
				t.Fatalf("third: %+v, want blocked for %d ms", d, w)
			}
			h.sleep(w / 2)
			d = h.check(t, l).Decisions[0] // while blocked: no new violation
			if d.Allowed || d.Remaining != 0 || d.RetryAfterMS != w/2 {
				t.Fatalf("while blocked: %+v, want the rest of the block, %d ms", d, w/2)
			}
			h.sleep(d.RetryAfterMS)
			if d := h.check(t, l).Decisions[0]; !d.Allowed {
				t.Fatalf("after the block, a new window: %+v", d)
			}
			d = h.check(t, l).Decisions[0] // 3 violations: blocked w × 3
			if d.Allowed || d.RetryAfterMS != 3*w {
				t.Fatalf("after a further violation: %+v, want blocked for %d ms", d, 3*w)
			}
		})
	}
}

func TestStore_ExpiryOnEveryKey(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			pen := &rules.Penalty{Enabled: true, DetectionWindowMS: hour, ViolationThreshold: 1, Multipliers: []int64{2}}
			for _, alg := range algs {
				s := spec(alg, 1, 60_000)
				s.Penalty = pen
				l := lim("rl:{u:ttl}:"+alg.String(), s)
				h.check(t, l)
				h.check(t, l) // violation and block keys
			}
			keys := h.keys(t)
			if len(keys) != 12 { // 4 counters, 4 violation sets, 4 blocks
				t.Fatalf("%d keys, want 12: %v", len(keys), keys)
			}
			for k, ttl := range keys {
				if ttl <= 0 || ttl > hour+1000 {
					t.Errorf("%s: ttl %d ms, want 0 < ttl <= %d", k, ttl, hour+1000)
				}
			}
		})
	}
}

func TestStore_PeekAndReset(t *testing.T) {
	ctx := context.Background()
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				key := "rl:{u:st}:" + alg.String()
				s := spec(alg, 5, hour)
				for range 2 {
					h.check(t, lim(key, s))
				}
				for range 2 { // peeking consumes nothing
					l := lim(key, s)
					d, err := h.s.Peek(ctx, time.Time{}, &l)
					if err != nil || d.Remaining != 3 || !d.Allowed || d.Limit != 5 {
						t.Fatalf("peek: %+v err=%v, want remaining 3", d, err)
					}
				}
				for range 3 {
					h.check(t, lim(key, s))
				}
				l := lim(key, s)
				if d, err := h.s.Peek(ctx, time.Time{}, &l); err != nil || d.Allowed || d.Remaining != 0 {
					t.Fatalf("peek at the limit: %+v %v", d, err)
				}
				if err := h.s.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				if d := h.check(t, lim(key, s)).Decisions[0]; !d.Allowed || d.Remaining != 4 {
					t.Fatalf("after reset: %+v", d)
				}
			})
		}
	}
}

// Concurrent checks on one counter admit exactly the limit.
func TestStore_Hammer(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				s := spec(alg, 100, hour)
				other := spec(rules.FixedWindow, 1000, hour)
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 15 {
							r := h.check(t, lim("rl:{u:hammer}:"+alg.String(), s), lim("rl:{u:h2}:"+alg.String(), other))
							if r.Allowed {
								allowed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				if n := allowed.Load(); n != 100 {
					t.Fatalf("%d admitted, want exactly 100", n)
				}
			})
		}
	}
}

func TestMemory_BoundedKeys(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000)
	m := NewMemory(MemoryOptions{MaxKeys: 640, Now: now.Load})
	for i := range 10_000 {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:"+strconv.Itoa(i)+"}:x", spec(rules.FixedWindow, 1, hour))}}
		var resp rules.CheckResponse
		if err := m.Check(context.Background(), time.Time{}, &req, &resp); err != nil || !resp.Allowed {
			t.Fatalf("check %d: %v %+v", i, err, resp)
		}
	}
	if n := m.Len(); n > 640 {
		t.Fatalf("%d keys stored, want at most 640", n)
	}
}

func TestRedis_UnavailableThenRecovers(t *testing.T) {
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func() error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim("rl:{u:down}:x", spec(rules.TokenBucket, 10, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), time.Time{}, &req, &resp)
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := check(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("with redis down: %v, want ErrUnavailable", err)
	}
	// The restarted server has no scripts loaded: NOSCRIPT must be handled.
	srv.Restart()
	if err := check(); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func TestRedis_URLs(t *testing.T) {
	for _, tc := range []struct {
		url     string
		wantErr string
	}{
		{"redis://127.0.0.1:1/0", ""},
		{"rediss://user:pass@127.0.0.1:1/2", ""},
		{"redis+sentinel://u:p@127.0.0.1:1,127.0.0.1:2/mymaster?db=1", ""},
		{"redis+cluster://127.0.0.1:1,127.0.0.1:2", ""},
		{"redis+sentinel://127.0.0.1:1", "master name"},
		{"redis+sentinel://127.0.0.1:1/m?db=x", "db"},
		{"redis+cluster://127.0.0.1:1/3", "no path"},
		{"127.0.0.1:6379", "missing scheme"},
		{"http://x", "unknown scheme"},
		{"redis+cluster://a:1,,b:2", "empty host"},
	} {
		c, _, _, err := newClient(RedisOptions{URL: tc.url})
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.url, err)
			} else {
				c.Close()
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want one containing %q", tc.url, err, tc.wantErr)
		}
	}
}

// A sentinel URL's parts: the master's name and credentials, and the
// sentinels' own from the query; a rediss+sentinel URL's TLS, which
// go-redis uses to the sentinels and the master alike.
func TestFailoverOptions(t *testing.T) {
	u, err := splitMultiHostURL("app:pw@s1:26379,s2:26379/mymaster?db=2&sentinel_username=watch&sentinel_password=spw")
	if err != nil {
		t.Fatal(err)
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	got, err := failoverOptions(u, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	want := &redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{"s1:26379", "s2:26379"}, Username: "app", Password: "pw",
		SentinelUsername: "watch", SentinelPassword: "spw", DB: 2, TLSConfig: tlsConf}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("options\n got %+v\nwant %+v", got, want)
	}
}

func TestSlot(t *testing.T) {
	// Reference values from Redis CLUSTER KEYSLOT.
	for key, want := range map[string]int{"foo": 12182, "{user1000}.following": 3443, "rl:{u:alice}:x": Slot("u:alice"), "bar": 5061} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}
