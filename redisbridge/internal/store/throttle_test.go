package store

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

func throttled(l rules.LimitRequest, maxDelayMS int64) rules.LimitRequest {
	l.Throttle, l.MaxDelayMS = true, maxDelayMS
	return l
}

// TestStore_ThrottleSlots: a burst at one instant against a throttle limit
// of 5 per second that may hold a request 2.5 s: each request gets the
// next slot, the ones that would wait longer are denied, and a denial
// consumes nothing (the next request is told the same).
func TestStore_ThrottleSlots(t *testing.T) {
	// delays lists the delays of the allowed requests in order, and retry
	// the retry_after of the first denied one, for a clock standing off
	// ms before a second starts.
	tests := []struct {
		alg    rules.Algorithm
		delays func(off int64) ([]int64, int64)
	}{
		// 200 ms per token once the burst of 5 is spent.
		{rules.TokenBucket, func(int64) ([]int64, int64) {
			return []int64{0, 0, 0, 0, 0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800, 2000, 2200, 2400}, 100
		}},
		// 5 per aligned second: this one, then the next two.
		{rules.FixedWindow, func(off int64) ([]int64, int64) {
			return []int64{0, 0, 0, 0, 0, off, off, off, off, off, off + 1000, off + 1000, off + 1000, off + 1000, off + 1000}, off + 2000 - 2500
		}},
		// 5 in any second: a second after the first five, and so on.
		{rules.SlidingLog, func(int64) ([]int64, int64) {
			return []int64{0, 0, 0, 0, 0, 1000, 1000, 1000, 1000, 1000, 2000, 2000, 2000, 2000, 2000}, 500
		}},
	}
	for _, h := range harnesses(t) {
		for _, tc := range tests {
			t.Run(h.name+"/"+tc.alg.String(), func(t *testing.T) {
				// The suite's clock has not moved past a second's last
				// 800 ms: a fixed window's next window is off ms away.
				if ms := h.check(t, lim("rl:{u:slots}:clock", spec(rules.FixedWindow, 1, 1))).NowMS % 1000; ms > 200 {
					h.sleep(1000 - ms)
				}
				now := h.check(t, lim("rl:{u:slots}:clock", spec(rules.FixedWindow, 1, 1))).NowMS
				want, retry := tc.delays(1000 - now%1000)
				l := throttled(lim("rl:{u:slots}:"+tc.alg.String(), spec(tc.alg, 5, 1000)), 2500)
				var delays []int64
				for {
					r := h.check(t, l)
					if !r.Allowed {
						if d := r.Decisions[0]; d.Allowed || d.RetryAfterMS != retry || r.DelayMS != 0 {
							t.Fatalf("after %d allowed: %+v, want denied with retry %d", len(delays), r, retry)
						}
						break
					}
					if !r.Decisions[0].Allowed {
						t.Fatalf("allowed with a denying decision: %+v", r)
					}
					delays = append(delays, r.DelayMS)
					if len(delays) > 100 {
						t.Fatal("never denied")
					}
				}
				if !slices.Equal(delays, want) {
					t.Fatalf("delays %v, want %v", delays, want)
				}
				// Denied requests reserved nothing.
				for range 3 {
					if r := h.check(t, l); r.Allowed || r.Decisions[0].RetryAfterMS != retry {
						t.Fatalf("again: %+v, want the same denial", r)
					}
				}
				// Once the wait fits, the next slot is the one after the last.
				h.sleep(retry)
				r := h.check(t, l)
				if !r.Allowed || r.DelayMS != 2500 {
					t.Fatalf("after retry_after: %+v, want allowed with the longest delay", r)
				}
			})
		}
	}
}

// TestStore_ThrottleWithOtherLimits: a check's throttle limits all reserve
// at the latest of their slots; when any limit denies, none is consumed.
func TestStore_ThrottleWithOtherLimits(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			// 10 per second (a slot each 100 ms) and 2 per second in aligned windows.
			fast := throttled(lim("rl:{u:many}:tb", spec(rules.TokenBucket, 10, 1000)), 5000)
			fast.Spec.Burst = 1
			slow := throttled(lim("rl:{u:many}:fw", spec(rules.FixedWindow, 2, 1000)), 5000)
			gate := lim("rl:{u:many}:gate", spec(rules.FixedWindow, 4, hour))
			// The slow limit's next window starts off ms from now.
			off := 1000 - h.check(t, lim("rl:{u:many}:clock", spec(rules.FixedWindow, 1, 1))).NowMS%1000
			if off < 200 {
				h.sleep(off)
				off = 1000
			}
			var delays []int64
			for range 4 {
				r := h.check(t, fast, slow, gate)
				if !r.Allowed {
					t.Fatalf("denied: %+v", r)
				}
				delays = append(delays, r.DelayMS)
			}
			// fast alone: 0, 100, 200, 300; slow alone: 0, 0, off, off. Together each
			// reserves where both can: 0, 100 (fast), off (slow), off+100 (fast after off).
			if want := []int64{0, 100, off, off + 100}; !slices.Equal(delays, want) {
				t.Fatalf("delays %v, want %v", delays, want)
			}
			// The gate (4 per hour) is spent: the next check is denied and
			// takes no slot from the throttle limits.
			r := h.check(t, fast, slow, gate)
			if r.Allowed || r.Decisions[2].Allowed || !r.Decisions[0].Allowed || !r.Decisions[1].Allowed || r.DelayMS != 0 {
				t.Fatalf("fifth: %+v, want denied by the gate only", r)
			}
			r = h.check(t, fast, slow)
			if !r.Allowed || r.DelayMS != off+1000 {
				t.Fatalf("without the gate: %+v, want delay %d (the slots the denied check did not take)", r, off+1000)
			}
			// A wait longer than one limit allows denies the check, and the
			// other throttle limit keeps its slot for the next one: fast's
			// next slot is 100 ms after the last, so the wait is off+1100.
			short := slow
			short.MaxDelayMS = 1000
			r = h.check(t, fast, short)
			if r.Allowed || !r.Decisions[0].Allowed || r.Decisions[1].Allowed || r.Decisions[1].RetryAfterMS != off+100 {
				t.Fatalf("short wait: %+v, want denied by the second limit, retry %d", r, off+100)
			}
			if r = h.check(t, fast); !r.Allowed || r.DelayMS != off+1100 {
				t.Fatalf("fast alone: %+v, want delay %d", r, off+1100)
			}
		})
	}
}

// TestStore_ThrottleExact: requests arriving at random times at a
// throttle limit pass at their slots (arrival + delay), and at those times
// no algorithm lets more through than it allows: a token bucket never
// spends tokens it has not refilled, a fixed window passes at most its
// limit in each window, a sliding log at most its limit in any window.
func TestStore_ThrottleExact(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range []rules.Algorithm{rules.TokenBucket, rules.FixedWindow, rules.SlidingLog} {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				const limit, window, burst = 7, 1000, 3
				s := spec(alg, limit, window)
				if alg == rules.TokenBucket {
					s.Burst = burst
				}
				l := throttled(lim("rl:{u:exact}:"+alg.String(), s), 1500)
				rng := rand.New(rand.NewPCG(uint64(alg), 7))
				var start int64
				var passes []int64
				for range 300 {
					r := h.check(t, l)
					if start == 0 {
						start = r.NowMS
					}
					if r.Allowed {
						passes = append(passes, r.NowMS+r.DelayMS)
					}
					h.sleep(rng.Int64N(120))
				}
				slices.Sort(passes)
				if len(passes) < 100 {
					t.Fatalf("only %d passed", len(passes))
				}
				switch alg {
				case rules.TokenBucket:
					tokens, at := float64(burst), start
					for _, p := range passes {
						tokens = min(burst, tokens+float64(p-at)*limit/window)
						at = p
						if tokens -= 1; tokens < -1e-9 {
							t.Fatalf("a pass at %d spends a token not refilled (%.3f)", p-start, tokens)
						}
					}
				case rules.FixedWindow:
					per := map[int64]int{}
					for _, p := range passes {
						if per[p/window]++; per[p/window] > limit {
							t.Fatalf("window %d passes more than %d", p/window, limit)
						}
					}
				default:
					for i := range passes {
						if j := i + limit; j < len(passes) && passes[j]-passes[i] < window {
							t.Fatalf("%d passes within %d ms", limit+1, passes[j]-passes[i])
						}
					}
				}
			})
		}
	}
}

// TestStore_ThrottleNotForSlidingWindow: a sliding window estimates, so a
// throttle limit that became one (an override may make it so) is decided
// as one that rejects.
func TestStore_ThrottleNotForSlidingWindow(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			l := throttled(lim("rl:{u:sw}:t", spec(rules.SlidingWindow, 2, 1000)), 5000)
			for i := range 3 {
				if r := h.check(t, l); r.Allowed != (i < 2) || r.DelayMS != 0 {
					t.Fatalf("check %d: %+v", i, r)
				}
			}
		})
	}
}

// TestRedis_ThrottleAcrossSlots: a check whose limits live in several
// Redis Cluster slots is never delayed (its slots cannot agree on one
// time): its throttle limits take it now or deny it, consuming nothing.
func TestRedis_ThrottleAcrossSlots(t *testing.T) {
	h := redisHarness(t, true)
	k := throttled(lim("rl:{u:across}:k", spec(rules.TokenBucket, 2, 1000)), 5000)
	g := lim("rl:{g}:across", spec(rules.FixedWindow, 100, hour))
	for i := range 2 {
		if r := h.check(t, k, g); !r.Allowed || r.DelayMS != 0 {
			t.Fatalf("check %d: %+v, want allowed at once", i, r)
		}
	}
	r := h.check(t, k, g)
	if r.Allowed || r.Decisions[0].Allowed || !r.Decisions[1].Allowed {
		t.Fatalf("third: %+v, want denied by the throttle limit", r)
	}
	if d := h.check(t, g).Decisions[0]; d.Remaining != 97 {
		t.Fatalf("the other slot's limit: remaining %d, want 97 (refunded)", d.Remaining)
	}
	// In one slot the same limit delays.
	if r := h.check(t, k); !r.Allowed || r.DelayMS != 500 {
		t.Fatalf("alone: %+v, want delayed 500 ms", r)
	}
}

// TestRefund_KeepsLaterReservations: a refund gives a throttle limit's
// units back only where they are the last the key counts; where requests
// reserved slots after them, it leaves the key alone (never more through).
func TestRefund_KeepsLaterReservations(t *testing.T) {
	// On Redis's own clock: refund.lua reads TIME, as check.lua does.
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 5 * time.Second, splitSlots: true, viaGoRedis: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := &harness{name: "redis", s: s}
	refund := func(l rules.LimitRequest) {
		t.Helper()
		if err := s.refund(t.Context(), []rules.LimitRequest{l}, []int{0}, []rules.Decision{{Allowed: true}}); err != nil {
			t.Fatal(err)
		}
	}
	// A fixed window of 2 holding 5 units: 2 now, 2 in the next window, 1 after.
	fw := throttled(lim("rl:{u:refund}:fw", spec(rules.FixedWindow, 2, 1000)), 5000)
	idx := h.check(t, fw).NowMS / 1000
	for range 4 {
		h.check(t, fw)
	}
	refund(fw)
	h.check(t, fw) // the last place in the window after the next
	if r := h.check(t, fw); r.NowMS+r.DelayMS != (idx+3)*1000 {
		t.Fatalf("after a refund with later reservations: %+v, want to pass at %d (three windows on)", r, (idx+3)*1000)
	}
	// Within one window the units come back.
	one := throttled(lim("rl:{u:refund}:one", spec(rules.FixedWindow, 3, hour)), 0)
	h.check(t, one)
	refund(one)
	if d := h.check(t, one).Decisions[0]; d.Remaining != 2 {
		t.Fatalf("refunded within the window: remaining %d, want 2", d.Remaining)
	}
	// A sliding log with a member scored after the check keeps it.
	sl := throttled(lim("rl:{u:refund}:sl", spec(rules.SlidingLog, 1, 1000)), 5000)
	first := h.check(t, sl).NowMS
	if r := h.check(t, sl); r.NowMS+r.DelayMS != first+1000 {
		t.Fatalf("second: %+v, want to pass at %d", r, first+1000)
	}
	refund(sl)
	if r := h.check(t, sl); r.NowMS+r.DelayMS != first+2000 {
		t.Fatalf("after the refund: %+v, want to pass at %d (no member taken back)", r, first+2000)
	}
}
