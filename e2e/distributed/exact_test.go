package distributed

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

const (
	clients     = 64
	bridgeCount = 3
	exactLimit  = 200
	// exactRedisTimeout is long: these tests count decisions, a loaded
	// machine must not turn them into failures.
	exactRedisTimeout = 2 * time.Second
)

// exactConfig has one rule per algorithm, each on its own path. Windows
// are long (the run fits in one), except for the per-window and sliding
// window counter checks. Host 0 keeps the local over-limit cache (the
// default), host 1 asks the bridge on every request.
func exactConfig(localCache bool) string {
	return `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "sluice_bridge", "timeout": "3s"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "local_cache": {"enabled": ` + fmt.Sprint(localCache) + `},
  "rules": [
    {"name": "tb", "scope": "user", "algorithm": "token_bucket", "limit": 200, "window": "24h", "match": {"paths": ["/tb"]}},
    {"name": "fw", "scope": "user", "algorithm": "fixed_window", "limit": 200, "window": "1h", "match": {"paths": ["/fw"]}},
    {"name": "sl", "scope": "user", "algorithm": "sliding_log", "limit": 200, "window": "1h", "match": {"paths": ["/sl"]}},
    {"name": "fw2s", "scope": "user", "algorithm": "fixed_window", "limit": 40, "window": "2s", "match": {"paths": ["/fw2s"]}},
    {"name": "sw", "scope": "user", "algorithm": "sliding_window", "limit": 40, "window": "1s", "match": {"paths": ["/sw"]}},
    {"name": "two-user", "scope": "user", "algorithm": "fixed_window", "limit": 5, "window": "1h", "match": {"paths": ["/two"]}},
    {"name": "two-global", "scope": "global", "algorithm": "sliding_log", "limit": 1000, "window": "1h", "match": {"paths": ["/two"]}}
  ]
}`
}

// TestExactness_SingleRedis and TestExactness_Cluster: 64 concurrent
// clients, 3 bridge replicas, 2 hosts of 2 plugin VMs, one key.
func TestExactness_SingleRedis(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	rs := redistest.Start(t)
	d := deploy(t, rs.URL, bridgeCount, exactRedisTimeout, exactConfig(true), exactConfig(false))
	exactness(t, d, single(rs), "single")
}

func TestExactness_Cluster(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	c := redistest.StartCluster(t, 3, 1)
	d := deploy(t, c.URL, bridgeCount, exactRedisTimeout, exactConfig(true), exactConfig(false))
	exactness(t, d, onCluster(t, c), "cluster")
	slotA, _ := c.Slot("rl:{u:x}:two-user")
	slotB, _ := c.Slot("rl:{g}:two-global")
	if slotA == slotB {
		t.Errorf("the two-limit check should span two slots (refund path): both in %d", slotA)
	}
}

// TestExactness_ClusterEmbedded: the same with each host's bridge in its
// own process (the gateway's --embed-bridge), so that the hosts share
// nothing but Redis Cluster.
func TestExactness_ClusterEmbedded(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	c := redistest.StartCluster(t, 3, 1)
	d := deploy(t, c.URL, 0, exactRedisTimeout, exactConfig(true), exactConfig(false))
	exactness(t, d, onCluster(t, c), "cluster-embedded")
}

func exactness(t *testing.T, d *deployment, at redisAt, topo string) {
	for _, tc := range []struct {
		rule  string
		check func(t *testing.T, key string)
	}{
		{"tb", func(t *testing.T, key string) {
			if n := doInt(t, at, "HGET", key+":tb", "tokens"); n != 0 {
				t.Errorf("tokens left in Redis: %d, want 0", n)
			}
		}},
		{"fw", func(t *testing.T, key string) {
			if n := doInt(t, at, "HGET", key+":fw", "c"); n != exactLimit {
				t.Errorf("window count in Redis: %d, want %d", n, exactLimit)
			}
		}},
		{"sl", func(t *testing.T, key string) {
			if n := doInt(t, at, "ZCARD", key+":sl"); n != exactLimit {
				t.Errorf("log entries in Redis: %d, want %d", n, exactLimit)
			}
		}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			// A fixed window is aligned to the hour: a run across the hour
			// is repeated on a fresh key.
			for attempt := 0; ; attempt++ {
				user := fmt.Sprintf("hot-%s-%s-%d", topo, tc.rule, attempt)
				start := time.Now()
				rs := d.burst(clients, 3*exactLimit, "/"+tc.rule, user)
				took := time.Since(start)
				if tc.rule == "fw" && start.Truncate(time.Hour) != time.Now().Truncate(time.Hour) && attempt == 0 {
					continue
				}
				st := statuses(rs)
				if st[200] != exactLimit || st[429] != 2*exactLimit {
					t.Fatalf("%d requests: statuses %v, want exactly %d admitted and %d refused", len(rs), st, exactLimit, 2*exactLimit)
				}
				tc.check(t, "rl:{u:"+user+"}:"+tc.rule)
				t.Logf("%s %s: %d clients, %d requests in %v: %d admitted", topo, tc.rule, clients, len(rs), took.Round(time.Millisecond), st[200])
				return
			}
		})
	}

	t.Run("fixed window per window", func(t *testing.T) {
		// Windows of 2 s aligned to the epoch; X-RateLimit-Reset (unix s)
		// is the window's end and names the window that admitted a request.
		// Whole windows the load spans admit exactly the limit. The load
		// runs until it has spanned one whole window (2 to 4 s).
		user := "per-window-" + topo
		stop := time.Now().Truncate(2 * time.Second).Add(4*time.Second + 50*time.Millisecond)
		var all []result
		for time.Now().Before(stop) {
			all = append(all, d.burst(clients, 4*clients, "/fw2s", user)...)
		}
		first, last := all[0].start, all[0].end
		perWindow := map[int64]int{}
		for _, r := range all {
			if r.status == 200 {
				perWindow[r.reset]++
			} else if r.status != 429 {
				t.Fatalf("status %d (%v)", r.status, r.err)
			}
			if r.start.Before(first) {
				first = r.start
			}
			if r.end.After(last) {
				last = r.end
			}
		}
		var ends []int64
		for end := range perWindow {
			ends = append(ends, end)
		}
		sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
		whole := 0
		for _, end := range ends {
			n := perWindow[end]
			if end%2 != 0 {
				t.Errorf("reset %d is not the end of an aligned 2 s window", end)
			}
			if n > 40 {
				t.Errorf("window ending %d admitted %d, limit 40", end, n)
			}
			// A window that began after the load started and ended before it stopped.
			if time.Unix(end-2, 0).After(first) && time.Unix(end, 0).Before(last) {
				whole++
				if n != 40 {
					t.Errorf("whole window ending %d admitted %d, want exactly 40", end, n)
				}
			}
		}
		if whole < 1 {
			t.Errorf("no whole window in %v of load: %v", last.Sub(first), perWindow)
		}
		t.Logf("%s fixed_window 40/2s: %d requests over %v, admitted per window %v (%d whole windows)", topo, len(all), last.Sub(first).Round(time.Millisecond), perWindow, whole)
	})

	t.Run("refused by one limit consumes nothing from the other", func(t *testing.T) {
		// Host 1 has no local cache: every refused request reaches the bridge.
		user := "two-" + topo
		before := doInt(t, at, "ZCARD", "rl:{g}:two-global:sl")
		rs := make([]result, 0, 60)
		for _, r := range d.burst(clients, 60, "/two", user) {
			rs = append(rs, r)
		}
		st := statuses(rs)
		if st[200] != 5 || st[429] != 55 {
			t.Fatalf("statuses %v, want 5 admitted and 55 refused", st)
		}
		if n := doInt(t, at, "HGET", keyOf(user, "two-user", "fw"), "c"); n != 5 {
			t.Errorf("per-user count %d, want 5", n)
		}
		if n := doInt(t, at, "ZCARD", "rl:{g}:two-global:sl") - before; n != 5 {
			t.Errorf("the global limit consumed %d for 5 admitted requests (55 refused by the per-user limit)", n)
		}
	})
}
