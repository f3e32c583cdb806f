package distributed

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// Leases (docs/config.md, lease) through the built plugin: 2 gateways of
// 4 worker VMs, 3 bridges, one key.
const (
	leaseVMs   = 4
	leaseLimit = 200
	leaseSize  = 10
	// leaseBound is the most a window may admit below its limit while
	// demand lasts: what the proxies may hold unspent, 1.5 × size each
	// (a lease and the last half of the one before).
	leaseBound = 3 * leaseSize / 2 * 2
)

// leaseConfig leases one limit per algorithm. The over-limit cache is
// off so that units handed back reach whichever gateway asks next (a
// cached denial keeps a gateway from asking until its retry time).
func leaseConfig(ttl string) string {
	lease := `"lease": {"size": ` + fmt.Sprint(leaseSize) + `, "ttl": "` + ttl + `"}`
	return `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "sluice_bridge", "timeout": "3s"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "local_cache": {"enabled": false},
  "rules": [
    {"name": "ltb", "scope": "user", "algorithm": "token_bucket", "limit": 200, "window": "24h", ` + lease + `, "match": {"paths": ["/token_bucket"]}},
    {"name": "lfw", "scope": "user", "algorithm": "fixed_window", "limit": 200, "window": "1h", ` + lease + `, "match": {"paths": ["/fixed_window"]}},
    {"name": "lsl", "scope": "user", "algorithm": "sliding_log", "limit": 200, "window": "1h", ` + lease + `, "match": {"paths": ["/sliding_log"]}},
    {"name": "lsw", "scope": "user", "algorithm": "sliding_window", "limit": 200, "window": "1h", ` + lease + `, "match": {"paths": ["/sliding_window"]}},
    {"name": "lfw1s", "scope": "user", "algorithm": "fixed_window", "limit": 100, "window": "1s", ` + lease + `, "match": {"paths": ["/fw1s"]}}
  ]
}`
}

func TestLease_Exact_SingleRedis(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	rs := redistest.Start(t)
	d := deployVMs(t, leaseVMs, rs.URL, bridgeCount, exactRedisTimeout, leaseConfig("300ms"), leaseConfig("300ms"))
	leaseExactness(t, d, single(rs), "single")
}

func TestLease_Exact_Cluster(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	c := redistest.StartCluster(t, 3, 1)
	d := deployVMs(t, leaseVMs, c.URL, bridgeCount, exactRedisTimeout, leaseConfig("300ms"), leaseConfig("300ms"))
	leaseExactness(t, d, onCluster(t, c), "cluster")
}

// leaseExactness: a burst of 64 clients over both gateways admits at most
// the limit, and at least the limit less what the proxies may hold; once
// the leases end, their unspent units are back in the store (its count
// is what was admitted); a second burst and a drain through one gateway
// then admit exactly what is left: the limit in all.
func leaseExactness(t *testing.T, d *deployment, at redisAt, topo string) {
	t.Cleanup(func() { // after the parallel subtests
		var grants int64
		for _, h := range d.hosts {
			v, _ := h.Metric("sluice_lease_grants_total")
			grants += v
		}
		t.Logf("%s: %d grants; lease units:%s", topo, grants, d.leaseUnits())
	})
	for _, alg := range []string{"token_bucket", "fixed_window", "sliding_log", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			for attempt := 0; ; attempt++ {
				user := fmt.Sprintf("lease-%s-%s-%d", topo, alg, attempt)
				start := time.Now()
				total, ok := leaseRun(t, d, at, alg, user)
				if !ok && attempt == 0 && start.Truncate(time.Hour) != time.Now().Truncate(time.Hour) {
					continue // a window algorithm's hour ended during the run
				}
				if total != leaseLimit {
					t.Fatalf("admitted %d in all, want exactly %d", total, leaseLimit)
				}
				return
			}
		})
	}
}

// leaseRun runs the bursts on a fresh key and returns what was admitted
// in all; false when the store's count did not match (checked again on
// a fresh key if an hour ended meanwhile).
func leaseRun(t *testing.T, d *deployment, at redisAt, alg, user string) (int, bool) {
	path := "/" + alg
	key := "rl:{u:" + user + "}:l" + map[string]string{"token_bucket": "tb", "fixed_window": "fw", "sliding_log": "sl", "sliding_window": "sw"}[alg]
	admitted := 0
	for burst := range 2 {
		rs := d.burst(clients, 2*leaseLimit, path, user)
		st := statuses(rs)
		if st[200]+st[429] != len(rs) {
			t.Fatalf("burst %d: statuses %v", burst, st)
		}
		admitted += st[200]
		if admitted > leaseLimit {
			t.Fatalf("burst %d: %d admitted in all, limit %d", burst, admitted, leaseLimit)
		}
		if burst == 0 && admitted < leaseLimit-leaseBound {
			t.Errorf("burst 0: %d admitted, below the limit less what 2 proxies may hold (%d)", admitted, leaseLimit-leaseBound)
		}
		// The leases end (300 ms) and within a tick (100 ms) what they
		// hold is back: the store counts exactly what was admitted.
		if !waitFor(3*time.Second, func() bool { return storeUsed(t, at, alg, key) == int64(admitted) }) {
			t.Errorf("burst %d: the store counts %d used, %d were admitted; the proxies' lease units (every key):%s",
				burst, storeUsed(t, at, alg, key), admitted, d.leaseUnits())
			return admitted, false
		}
		t.Logf("%s burst %d: %d requests, %d admitted (%d in all); the store counts %d once the leases ended",
			alg, burst, len(rs), st[200], admitted, admitted)
	}
	// Drain what is left through gateway 0 alone: its own leases are
	// spent by its own VMs, so the last unit is admitted too.
	for refused := 0; refused < 3; {
		if r := d.get(0, path, user); r.status == 200 {
			admitted++
			refused = 0
		} else if r.status == 429 {
			refused++
		} else {
			t.Fatalf("drain: status %d (%v)", r.status, r.err)
		}
	}
	return admitted, true
}

// storeUsed is what the store counts as used of key's limit (algorithm
// alg), leases not handed back included.
func storeUsed(t *testing.T, at redisAt, alg, key string) int64 {
	switch alg {
	case "token_bucket":
		return leaseLimit - doInt(t, at, "HGET", key+":tb", "tokens")
	case "fixed_window":
		return doInt(t, at, "HGET", key+":fw", "c")
	case "sliding_window":
		return doInt(t, at, "HGET", key+":sw", "c")
	}
	return doInt(t, at, "ZCARD", key+":sl")
}

func waitFor(d time.Duration, f func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if f() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestLease_UnderAdmission measures what leases cost: a fixed window of
// 100 per second, leases of 10 (which end with their window: their ttl
// of 2 s is longer), and demand well above the limit, through 2 gateways
// of 4 VMs. Every window admits at most the limit; a window whose units
// ran out (a request was refused in it) admits at least the limit less
// what the proxies held unspent then (1.5 × size each). Two shapes:
// demand shared by both gateways, and demand at gateway 0 while gateway 1
// sends 3 requests at the start of each window and then nothing, so that
// what its lease holds stays behind until the window ends (the worst
// case: units held by a proxy whose clients left). Windows are told
// apart by the bridge's X-RateLimit-Reset (a fixed window's end), on
// answers from leases too, so the machine's load cannot blur them.
func TestLease_UnderAdmission(t *testing.T) {
	t.Parallel() // counts, not timings: side by side with the others
	rs := redistest.Start(t)
	cfg := leaseConfig("2s")
	d := deployVMs(t, leaseVMs, rs.URL, bridgeCount, exactRedisTimeout, cfg, cfg)
	for _, shape := range []string{"shared", "one-idle"} {
		t.Run(shape, func(t *testing.T) {
			t.Parallel()
			user := "under-" + shape
			var mu sync.Mutex
			var all []result
			add := func(r result) {
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
			}
			stop := time.Now().Add(3500 * time.Millisecond)
			var wg sync.WaitGroup
			for c := range 4 {
				wg.Go(func() {
					for time.Now().Before(stop) {
						g := 0
						if shape == "shared" {
							g = c % 2
						}
						add(d.get(g, "/fw1s", user))
					}
				})
			}
			if shape == "one-idle" {
				for next := time.Now().Truncate(time.Second).Add(time.Second); next.Before(stop); next = next.Add(time.Second) {
					time.Sleep(time.Until(next))
					for range 3 {
						add(d.get(1, "/fw1s", user))
					}
				}
			}
			wg.Wait()
			admitted, refused := map[int64]int{}, map[int64]int{}
			for _, r := range all {
				switch r.status {
				case 200:
					admitted[r.reset]++
				case 429:
					refused[r.reset]++
				default:
					t.Fatalf("status %d (%v)", r.status, r.err)
				}
			}
			lo, hi, saturated := 1<<30, 0, 0
			for end, n := range admitted {
				if n > 100 {
					t.Errorf("window ending %d admitted %d, limit 100", end, n)
				}
				if refused[end] == 0 {
					continue // its units never ran out: demand stopped first
				}
				saturated++
				lo, hi = min(lo, n), max(hi, n)
				if n < 100-leaseBound {
					t.Errorf("window ending %d admitted %d with %d refused, below the limit less the bound (%d)", end, n, refused[end], 100-leaseBound)
				}
			}
			if saturated < 2 {
				t.Fatalf("%d windows ran out of units in %d requests", saturated, len(all))
			}
			t.Logf("%s demand: %d requests, %d windows ran out, admitted %d to %d of 100 (bound: at least %d)",
				shape, len(all), saturated, lo, hi, 100-leaseBound)
		})
	}
}

// TestLease_ServesThroughFailure: with the bridges down, or Redis, a
// proxy keeps answering from the leases it holds until they end; then
// the failure mode answers (fail_closed: 503). Nothing beyond the units
// granted is admitted.
func TestLease_ServesThroughFailure(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	const cfg = `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "sluice_bridge", "timeout": "300ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "rules": [{"name": "lfw", "scope": "user", "algorithm": "fixed_window", "limit": 100000, "window": "1h",
             "lease": {"size": 2000, "ttl": "1500ms"}, "match": {"paths": ["/fixed_window"]}}]
}`
	for _, fault := range []string{"bridges", "redis"} {
		t.Run(fault, func(t *testing.T) {
			rs := redistest.Start(t)
			d := deployVMs(t, leaseVMs, rs.URL, bridgeCount, 200*time.Millisecond, cfg, cfg)
			user := "fail-" + fault
			// Each gateway gets a lease (its first request) and spends a
			// little of it. A lease runs for its ttl from when its request
			// was sent, between that request's start and end.
			var from, until [2]time.Time
			for g := range d.gateways {
				for i := range 5 {
					r := d.get(g, "/fixed_window", user)
					if r.status != 200 {
						t.Fatalf("before the fault: %d (%v)", r.status, r.err)
					}
					if i == 0 {
						from[g], until[g] = r.start.Add(ttl), r.end.Add(ttl)
					}
				}
			}
			switch fault {
			case "bridges":
				for _, b := range d.bridges {
					b.stop()
				}
			case "redis":
				rs.Stop()
			}
			var mu sync.Mutex
			var results [2][]result
			var wg sync.WaitGroup
			end := maxTime(until[0], until[1]).Add(time.Second)
			for c := range 8 {
				wg.Go(func() {
					g := c % 2
					for time.Now().Before(end) {
						r := d.get(g, "/fixed_window", user)
						mu.Lock()
						results[g] = append(results[g], r)
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			var served, failed int
			for g := range results {
				for _, r := range results[g] {
					switch {
					// The proxy counts a lease's ttl in whole milliseconds
					// of its clock from the millisecond its request was
					// sent: its lease may end up to 1 ms before from[g].
					case r.end.Before(from[g].Add(-time.Millisecond)):
						if r.status != 200 || !r.decided {
							t.Errorf("gateway %d, %v before its lease ended: %d (%v)", g, from[g].Sub(r.end).Round(time.Millisecond), r.status, r.err)
						}
						served++
					case r.start.After(until[g].Add(100 * time.Millisecond)):
						if r.status != 503 {
							t.Errorf("gateway %d, %v after its lease ended: %d, want the failure mode's 503", g, r.start.Sub(until[g]).Round(time.Millisecond), r.status)
						}
						failed++
					}
				}
			}
			if served == 0 || failed == 0 {
				t.Fatalf("%d answered from leases, %d by the failure mode: the test saw neither side", served, failed)
			}
			t.Logf("%s down: %d requests answered from leases until they ended, then %d by fail_closed", fault, served, failed)
		})
	}
}

// leaseUnits sums the lease unit counters of d's proxies, for a failure
// to say where units that did not come back went.
func (d *deployment) leaseUnits() string {
	var b strings.Builder
	for _, name := range []string{"granted", "spent", "returned", "unreturned"} {
		var n int64
		for _, h := range d.hosts {
			v, _ := h.Metric("sluice_lease_units_" + name + "_total")
			n += v
		}
		fmt.Fprintf(&b, " %s %d", name, n)
	}
	return b.String()
}
