package store

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func leased(l rules.LimitRequest, size, ttlMS int64) rules.LimitRequest {
	l.Spec.Lease = rules.Lease{Size: size, TTLMS: ttlMS}
	return l
}

func (h *harness) op(t *testing.T, op rules.Op, ls ...rules.LimitRequest) rules.CheckResponse {
	t.Helper()
	req := rules.CheckRequest{Op: op, Limits: append([]rules.LimitRequest(nil), ls...)}
	var resp rules.CheckResponse
	if err := h.s.Check(context.Background(), time.Time{}, &req, &resp); err != nil {
		t.Fatalf("%s: %v: %v", h.name, op, err)
	}
	return resp
}

// A check that asks for a lease takes its units in the same call as its
// own cost, all algorithms alike; units handed back are there again, and
// a return the store no longer recognizes gives nothing back.
func TestStore_LeaseGrantAndReturn(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				plain := lim("rl:{u:lease}:"+alg.String(), spec(alg, 10, hour))
				l := leased(plain, 4, 30_000)
				first := h.check(t, l).Decisions[0]
				if !first.Allowed || first.Lease.Units != 4 || first.Remaining != 5 || first.Lease.TTLMS != 30_000 {
					t.Fatalf("first check: %+v, want a lease of 4 and 5 remaining", first)
				}
				second := h.check(t, l).Decisions[0]
				if !second.Allowed || second.Lease.Units != 4 || second.Remaining != 0 {
					t.Fatalf("second check: %+v, want a lease of 4 and 0 remaining", second)
				}
				if d := h.check(t, l).Decisions[0]; d.Allowed || d.Lease.Units != 0 {
					t.Fatalf("third check: %+v, want denied without a lease", d)
				}
				back := l
				back.Return = rules.LeaseReturn{Tag: first.Lease.Tag, Granted: 4, Units: 3}
				h.op(t, rules.OpReturn, back)
				if d := h.check(t, plain).Decisions[0]; !d.Allowed || d.Remaining != 2 {
					t.Fatalf("after 3 units came back: %+v, want allowed with 2 remaining", d)
				}
				stale := l
				stale.Return = rules.LeaseReturn{Tag: first.Lease.Tag - 1000, Granted: 4, Units: 4}
				if alg == rules.TokenBucket {
					// The first lease's generation no longer holds it:
					// handing it back twice gives nothing.
					stale.Return.Tag = first.Lease.Tag
				}
				h.op(t, rules.OpReturn, stale)
				if d := h.check(t, plain).Decisions[0]; !d.Allowed || d.Remaining != 1 {
					t.Fatalf("after a return the store does not hold: %+v, want 1 remaining", d)
				}
			})
		}
	}
}

// A renewal grants a lease without a request: nothing but the lease is
// consumed, and a lease is never larger than what is left.
func TestStore_LeaseRenewal(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				l := leased(lim("rl:{u:renew}:"+alg.String(), spec(alg, 10, hour)), 4, 30_000)
				for i, want := range []struct{ units, remaining int64 }{{4, 6}, {4, 2}, {2, 0}, {0, 0}} {
					d := h.op(t, rules.OpRenew, l).Decisions[0]
					if d.Lease.Units != want.units || d.Remaining != want.remaining {
						t.Fatalf("renewal %d: %+v, want a lease of %d and %d remaining", i, d, want.units, want.remaining)
					}
				}
			})
		}
	}
}

// Window leases end with their window; a sliding log's and a token
// bucket's run their whole ttl.
func TestStore_LeaseTTL(t *testing.T) {
	for _, h := range harnesses(t) {
		for _, alg := range algs {
			t.Run(h.name+"/"+alg.String(), func(t *testing.T) {
				// The fake clock starts 123 ms into a second.
				l := leased(lim("rl:{u:ttl}:"+alg.String(), spec(alg, 10, 1000)), 2, 5000)
				d := h.check(t, l).Decisions[0]
				want := int64(5000)
				if alg == rules.FixedWindow || alg == rules.SlidingWindow {
					want = 1000 - 123
				}
				if d.Lease.Units != 2 || d.Lease.TTLMS != want {
					t.Fatalf("%+v, want a lease of 2 for %d ms", d, want)
				}
			})
		}
	}
}

// What a lease holds counts for the limit until it expires: a token
// bucket refills up to its burst minus what live leases hold, and a
// sliding log keeps a lease's units for a window from its expiry. So
// whatever a proxy spends of its lease, no interval admits more than the
// limit lets through.
func TestStore_LeaseHoldsItsUnits(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name+"/token_bucket", func(t *testing.T) {
			// 10 per second, burst 10; a lease of 6 for 5 s.
			l := lim("rl:{u:hold}:tb", spec(rules.TokenBucket, 10, 1000))
			if d := h.check(t, leased(l, 6, 5000)).Decisions[0]; d.Lease.Units != 6 || d.Remaining != 3 {
				t.Fatalf("grant: %+v", d)
			}
			h.sleep(3000) // a bucket without leases would be full again
			n := 0
			for h.check(t, l).Allowed {
				n++
			}
			if n != 4 {
				t.Fatalf("%d admitted beside a lease of 6 with a burst of 10, want 4", n)
			}
			// The hold lasts twice the lease's ttl (units handed back at
			// its end still find it): until then the bucket refills to
			// 4 only; when it ends it is what it refilled to beside the
			// hold, and a second later (10 per second) it is full.
			for _, want := range []struct{ sleep, n int64 }{{2000, 4}, {5000, 4}, {1000, 10}} {
				h.sleep(want.sleep)
				n := int64(0)
				for h.check(t, l).Allowed {
					n++
				}
				if n != want.n {
					t.Fatalf("%d admitted %d ms later, want %d", n, want.sleep, want.n)
				}
			}
		})
		t.Run(h.name+"/sliding_log", func(t *testing.T) {
			// 10 per second; a lease of 6 for 500 ms, spent at its end.
			l := lim("rl:{u:hold}:sl", spec(rules.SlidingLog, 10, 1000))
			if d := h.check(t, leased(l, 6, 500)).Decisions[0]; d.Lease.Units != 6 {
				t.Fatalf("grant: %+v", d)
			}
			h.sleep(1200) // a second after the grant, not after the lease's end
			n := 0
			for h.check(t, l).Allowed {
				n++
			}
			if n != 4 {
				t.Fatalf("%d admitted within a second of the lease's end, want 4", n)
			}
		})
	}
}

// A key listed twice in one check, a limit with a penalty and a log_only
// limit are never leased.
func TestStore_LeaseNever(t *testing.T) {
	pen := &rules.Penalty{Enabled: true, DetectionWindowMS: hour, ViolationThreshold: 3, Multipliers: []int64{1}}
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			l := leased(lim("rl:{u:never}:twice", spec(rules.FixedWindow, 10, hour)), 4, 1000)
			for i, d := range h.check(t, l, l).Decisions {
				if d.Lease.Units != 0 {
					t.Errorf("listing %d of a key listed twice: %+v", i, d)
				}
			}
			p := leased(lim("rl:{u:never}:penalty", spec(rules.FixedWindow, 10, hour)), 4, 1000)
			p.Spec.Penalty = pen
			lo := leased(lim("rl:{u:never}:log", spec(rules.FixedWindow, 10, hour)), 4, 1000)
			lo.LogOnly = true
			for _, d := range h.check(t, p, lo).Decisions {
				if d.Lease.Units != 0 {
					t.Errorf("%+v: leased", d)
				}
			}
		})
	}
}
