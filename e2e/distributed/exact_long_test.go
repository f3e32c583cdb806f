//go:build long

package distributed

import (
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// The sliding window counter's error is measured against the wall clock
// from the clients' side, which a loaded machine blurs: it is a soak, run
// by make test-long, and its figures are the ones docs/reliability.md
// quotes.

func TestLong_SlidingWindowError_SingleRedis(t *testing.T) {
	rs := redistest.Start(t)
	d := deploy(t, rs.URL, bridgeCount, exactRedisTimeout, exactConfig(true), exactConfig(false))
	slidingWindowError(t, d, "sw-single", "single")
}

func TestLong_SlidingWindowError_Cluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	d := deploy(t, c.URL, bridgeCount, exactRedisTimeout, exactConfig(true), exactConfig(false))
	slidingWindowError(t, d, "sw-cluster", "cluster")
}

// slidingWindowError measures how far the weighted sliding window counter
// (40 per second) is from an exact count: the most requests admitted in any
// 1 s interval, which an exact sliding log keeps at the limit. Two traffic
// shapes: bursts with pauses (every gateway, local cache included), and the
// adversarial one, a full window admitted at the very end of an aligned
// window and steady traffic in the next (through host 1, no local cache, so
// every request reaches the bridge).
func slidingWindowError(t *testing.T, d *deployment, user, topo string) {
	const limit = 40
	// Steady: bursts every ~50 ms for 4 s; measured from the second whole
	// window on, once the previous window's count is in the estimate.
	var all []result
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		all = append(all, d.burst(16, 48, "/sw", user)...)
		time.Sleep(40 * time.Millisecond)
	}
	maxSteady, perSecond := maxPerSecond(t, all, start.Truncate(time.Second).Add(2*time.Second))
	t.Logf("%s sliding_window 40/1s, steady: %d requests; admitted per aligned second %v; most admitted in any 1 s: %d (%.2f × limit)",
		topo, len(all), perSecond, maxSteady, float64(maxSteady)/limit)
	// The estimate is never below the current window's count, so an
	// aligned window admits at most the limit (timestamps blur an
	// admission near a boundary by its latency, hence the allowance).
	for sec, n := range perSecond {
		if n > limit+3 {
			t.Errorf("aligned second %d admitted %d, limit %d", sec, n, limit)
		}
	}
	// With traffic all along, the estimate lets admissions through evenly
	// and the counter is close to exact.
	if maxSteady > limit*5/4 {
		t.Errorf("steady traffic: %d admitted in 1 s, want about the limit %d", maxSteady, limit)
	}

	// Adversarial: wait for 0.85 s into an aligned second, use up the
	// window at its end, then send steadily through the next window.
	user += "-adv"
	now := time.Now()
	at := now.Truncate(time.Second).Add(850 * time.Millisecond)
	if at.Before(now) {
		at = at.Add(time.Second)
	}
	time.Sleep(time.Until(at))
	all = d.burstVia(1, 16, 2*limit, "/sw", user)
	end := at.Truncate(time.Second).Add(1950 * time.Millisecond)
	for time.Now().Before(end) {
		all = append(all, d.burstVia(1, 4, 4, "/sw", user)...)
		time.Sleep(5 * time.Millisecond)
	}
	maxAdv, _ := maxPerSecond(t, all, time.Time{})
	t.Logf("%s sliding_window 40/1s, adversarial: %d requests; most admitted in any 1 s: %d (%.2f × limit)",
		topo, len(all), maxAdv, float64(maxAdv)/limit)
	// The estimate prev×(1−f)+cur ≤ limit lets cur reach limit×f after a
	// previous window full at its end, so an interval of 1 s holds at most
	// limit + limit×f < 2 × limit. Client timestamps blur each admission by
	// its latency, hence the small allowance.
	if hard := 2*limit + 2; maxAdv > hard {
		t.Errorf("adversarial traffic: %d admitted in 1 s, above the bound %d", maxAdv, hard)
	}
	if maxAdv < limit*3/2 {
		t.Errorf("adversarial traffic: only %d admitted in 1 s; the test no longer shows the counter's error", maxAdv)
	}
}

// maxPerSecond returns the most requests admitted in any interval of 1 s
// and the admissions per aligned second (unix time), counting admissions
// from the time from on.
func maxPerSecond(t *testing.T, all []result, from time.Time) (int, map[int64]int) {
	t.Helper()
	var admitted []time.Time
	for _, r := range all {
		switch r.status {
		case 200:
			// The bridge decided between start and end; take the middle.
			if a := r.start.Add(r.took() / 2); !a.Before(from) {
				admitted = append(admitted, a)
			}
		case 429:
		default:
			t.Fatalf("status %d (%v)", r.status, r.err)
		}
	}
	if len(admitted) < 2 {
		t.Fatalf("%d admitted", len(admitted))
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	maxCount, j := 0, 0
	for i, a := range admitted {
		for !admitted[j].Add(time.Second).After(a) {
			j++
		}
		if n := i - j + 1; n > maxCount {
			maxCount = n
		}
	}
	perSecond := map[int64]int{}
	for _, a := range admitted {
		perSecond[a.Unix()]++
	}
	return maxCount, perSecond
}
