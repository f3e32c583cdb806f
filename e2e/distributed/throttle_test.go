package distributed

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// Throttle limits (docs/config.md, throttle) through the built plugin, the
// real bridges and Redis: requests held into their slots, never more than
// the limit passed in a window, whatever gateway or bridge decided them.

// throttleConfig throttles /t at 50 a second with the given algorithm and
// max_delay; every place of a VM's waiting bound is free. The call-out
// timeout is long, as exactRedisTimeout is: these tests count decisions,
// and a burst of hundreds of call-outs on a loaded machine must not turn
// some into the failure mode's answers (seen with 4 test packages at once).
func throttleConfig(alg, maxDelay, failure string, maxWaiting int) string {
	return fmt.Sprintf(`{
  "failure_mode": %q,
  "bridge": {"cluster": "sluice_bridge", "timeout": "2s"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "throttle": {"max_waiting": %d},
  "rules": [{"name": "t", "match": {"paths": ["/t"]}, "algorithm": %q, "limit": 50, "window": "1s",
             "action": "throttle", "max_delay": %q}]
}`, failure, maxWaiting, alg, maxDelay)
}

// lateTolerance is how long after its slot a request may reach the
// upstream: the bridge's answer on its way back and the proxy's timer,
// on a loaded two-core machine.
const lateTolerance = 250 * time.Millisecond

// slotsOf returns the sorted slots (unix ms) a sliding log holds.
func slotsOf(t *testing.T, at redisAt, key string) []int64 {
	t.Helper()
	v, err := redistest.Do(at(key), time.Second, "ZRANGE", key, "0", "-1", "WITHSCORES")
	if err != nil {
		t.Fatal(err)
	}
	arr, _ := v.([]any)
	var out []int64
	for i := 1; i < len(arr); i += 2 {
		n, _ := strconv.ParseFloat(arr[i].(string), 64)
		out = append(out, int64(n))
	}
	slices.Sort(out)
	return out
}

// maxIn is the most of the sorted times ts (unix ms) in any interval
// [t, t+window).
func maxIn(ts []int64, window int64) int {
	most := 0
	for i := range ts {
		j, _ := slices.BinarySearch(ts, ts[i]+window)
		most = max(most, j-i)
	}
	return most
}

// lateness checks that the k-th of the sorted passes came no earlier than
// the k-th of the sorted slots, each request passing at its own slot or
// after, and at most lateTolerance after; it returns the most.
func lateness(t *testing.T, passes, slots []int64) int64 {
	t.Helper()
	if len(passes) != len(slots) {
		t.Fatalf("%d passes for %d slots", len(passes), len(slots))
	}
	var late int64
	for k := range passes {
		if passes[k] < slots[k] {
			t.Fatalf("pass %d at %d, before slot %d", k, passes[k], slots[k])
		}
		late = max(late, passes[k]-slots[k])
	}
	if time.Duration(late)*time.Millisecond > lateTolerance {
		t.Errorf("a request reached the upstream %d ms after its slot (tolerance %v)", late, lateTolerance)
	}
	return late
}

func unixMS(ts []time.Time) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = t.UnixMilli()
	}
	return out
}

// TestThrottle_Burst: 200 requests in a burst at 50 a second that may wait
// 5 s all pass, at their slots: 50 at once, then 50 each second. A
// sliding log reserves slots no window of a second holds more than 50 of,
// wherever it starts, and the k-th request reaches the upstream no earlier
// than the k-th slot and soon after it; a fixed window passes at most 50
// in each aligned second.
func TestThrottle_Burst(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	rs := redistest.Start(t)
	for _, alg := range []string{"sliding_log", "fixed_window"} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			d := deployVMs(t, 2, rs.URL, 1, exactRedisTimeout, throttleConfig(alg, "5s", "fail_closed", 1000))
			user := "burst-" + alg
			if alg == "fixed_window" {
				// Start as a window starts: the requests decided at once
				// then reach the upstream within their window too.
				time.Sleep(time.Duration(1000-time.Now().UnixMilli()%1000) * time.Millisecond)
			}
			begin := time.Now()
			rs200 := d.burst(200, 200, "/t", user)
			if st := statuses(rs200); st[200] != 200 {
				t.Fatalf("statuses %v, want 200 × 200", st)
			}
			passes := unixMS(d.passes.of("/t", user))
			if len(passes) != 200 {
				t.Fatalf("%d reached the upstream", len(passes))
			}
			held := 0
			for _, r := range rs200 {
				if r.delayMS > 0 {
					held++
				}
				if r.took() < time.Duration(r.delayMS)*time.Millisecond {
					t.Errorf("answered after %v, before its delay of %d ms", r.took(), r.delayMS)
				}
			}
			if held < 140 {
				t.Errorf("%d held, want about 150", held)
			}
			if alg == "fixed_window" {
				per := map[int64]int{}
				for _, p := range passes {
					per[p/1000]++
				}
				for w, n := range per {
					if n > 50 {
						t.Errorf("second %d passed %d, more than 50", w, n)
					}
				}
				t.Logf("%s: 200 in %v, per aligned second %v", alg, time.Since(begin).Round(time.Millisecond), per)
				return
			}
			slots := slotsOf(t, single(rs), keyOf(user, "t", "sl"))
			if len(slots) != 200 {
				t.Fatalf("%d slots reserved, want 200", len(slots))
			}
			if n := maxIn(slots, 1000); n > 50 {
				t.Errorf("the store reserved %d slots in one second, more than 50", n)
			}
			late := lateness(t, passes, slots)
			// At the upstream: within any second less the lateness
			// measured, at most the limit (the slots are exact; requests
			// leave the proxy up to late ms after theirs).
			if n := maxIn(passes, 1000-late); n > 50 {
				t.Errorf("%d passed within %d ms", n, 1000-late)
			}
			t.Logf("%s: 200 in %v; latest %d ms after its slot; most in a second of slots %d, of passes (%d ms) %d",
				alg, time.Since(begin).Round(time.Millisecond), late, maxIn(slots, 1000), 1000-late, maxIn(passes, 1000-late))
		})
	}
}

// TestThrottle_MaxDelay: with max_delay 1 s, the requests whose slot is
// further away get 429 at once and reserve nothing: 100 of the 200 pass
// (now and a second later), the log holds 100 slots, and a request after
// the burst is told to retry when its wait would fit.
func TestThrottle_MaxDelay(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	rs := redistest.Start(t)
	// Without the over-limit cache every refusal is the bridge's, so each
	// is counted as too long: with it, a request that came after a
	// refusal was cached is refused from the cache, and how many do is
	// the scheduler's to say.
	cfg := strings.Replace(throttleConfig("sliding_log", "1s", "fail_closed", 1000), `"throttle":`, `"local_cache": {"enabled": false}, "throttle":`, 1)
	d := deployVMs(t, 2, rs.URL, 1, exactRedisTimeout, cfg)
	user := "maxdelay"
	rs200 := d.burst(200, 200, "/t", user)
	st := statuses(rs200)
	if st[200] != 100 || st[429] != 100 {
		t.Fatalf("statuses %v, want 100 passed and 100 refused", st)
	}
	for _, r := range rs200 {
		if r.status == 429 && r.took() > 900*time.Millisecond {
			t.Errorf("a refusal took %v: refused requests must not wait", r.took())
		}
	}
	if n := len(slotsOf(t, single(rs), keyOf(user, "t", "sl"))); n != 100 {
		t.Fatalf("%d slots reserved, want 100: refusals consumed", n)
	}
	m := func(name string) int64 { v, _ := d.hosts[0].Metric(name); return v }
	if m("sluice_throttle_too_long_total") != 100 || m("sluice_throttled_total") < 40 || m("sluice_throttle_waiting") != 0 {
		t.Errorf("metrics: too long %d, throttled %d, waiting %d", m("sluice_throttle_too_long_total"), m("sluice_throttled_total"), m("sluice_throttle_waiting"))
	}
}

// TestThrottle_Distributed: 2 gateways of 4 worker VMs and 3 bridges, one
// limit of 50 a second: 300 requests all pass, and no second of slots
// holds more than 50, on single Redis and on Redis Cluster alike.
func TestThrottle_Distributed(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	for _, topo := range []string{"single", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			t.Parallel()
			var url string
			var at redisAt
			if topo == "single" {
				rs := redistest.Start(t)
				url, at = rs.URL, single(rs)
			} else {
				c := redistest.StartCluster(t, 3, 0)
				url, at = c.URL, onCluster(t, c)
			}
			cfg := throttleConfig("sliding_log", "6s", "fail_closed", 1000)
			d := deployVMs(t, 4, url, bridgeCount, exactRedisTimeout, cfg, cfg)
			user := "dist-" + topo
			rs300 := d.burst(300, 300, "/t", user)
			if st := statuses(rs300); st[200] != 300 {
				t.Fatalf("statuses %v, want 300 × 200", st)
			}
			slots := slotsOf(t, at, keyOf(user, "t", "sl"))
			if len(slots) != 300 || maxIn(slots, 1000) != 50 {
				t.Fatalf("%d slots, at most %d in a second; want 300 and 50", len(slots), maxIn(slots, 1000))
			}
			late := lateness(t, unixMS(d.passes.of("/t", user)), slots)
			t.Logf("%s: latest %d ms after its slot", topo, late)
		})
	}
}

// TestThrottle_WaitingBound: a flood (100 clients sending 1,000 requests
// as fast as they are answered) at a throttle limit whose proxy may hold
// 10 requests per VM: never more than that is held at once, and the bound
// fills; the rest get 429 at once (counted as refused for a full bound),
// and they reserve nothing.
func TestThrottle_WaitingBound(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	rs := redistest.Start(t)
	cfg := throttleConfig("sliding_log", "20s", "fail_closed", 10)
	d := deployVMs(t, 2, rs.URL, 1, exactRedisTimeout, cfg)
	h := d.hosts[0]
	var most atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, _ := h.Metric("sluice_throttle_waiting")
			most.Store(max(most.Load(), n))
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	user := "flood"
	rsAll := d.burst(100, 1000, "/t", user)
	close(stop)
	wg.Wait()
	st := statuses(rsAll)
	if most.Load() != 20 {
		t.Errorf("at most %d held at once; want 20: 10 per VM, reached", most.Load())
	}
	if st[200]+st[429] != 1000 || st[429] == 0 {
		t.Fatalf("statuses %v", st)
	}
	for _, r := range rsAll {
		if r.status == 429 && r.took() > time.Second {
			t.Errorf("a refusal took %v", r.took())
		}
	}
	if full, _ := h.Metric("sluice_throttle_full_total"); full != int64(st[429]) {
		t.Errorf("refused for a full bound: %d, refusals %d", full, st[429])
	}
	// A refusal that reserved a slot leaves more slots than passes. Fewer
	// means the log dropped slots a window old, as it does when the flood
	// outlasts a window (a slow machine, the race detector).
	switch n := len(slotsOf(t, single(rs), keyOf(user, "t", "sl"))); {
	case n > st[200]:
		t.Errorf("%d slots reserved for %d passed: refusals consumed", n, st[200])
	case n < st[200]:
		t.Logf("%d slots left for %d passed: the older ones expired", n, st[200])
	}
	t.Logf("1000 requests: %d passed, %d refused, at most %d held at once", st[200], st[429], most.Load())
}

// TestThrottle_BridgeFails: the bridges fail while requests are held.
// Those keep their slots and pass at them; new requests are answered by
// the failure mode within the call-out timeout (fail_open passes them,
// fail_closed refuses them with 503).
func TestThrottle_BridgeFails(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	rs := redistest.Start(t)
	// The failure mode's answer is due within the call-out timeout.
	const timeout = 500 * time.Millisecond
	short := func(cfg string) string {
		out := strings.Replace(cfg, `"timeout": "2s"`, fmt.Sprintf(`"timeout": "%v"`, timeout), 1)
		if out == cfg {
			t.Fatal("no call-out timeout to shorten in throttleConfig")
		}
		return out
	}
	d := deployVMs(t, 2, rs.URL, 1, exactRedisTimeout,
		short(throttleConfig("sliding_log", "5s", "fail_open", 1000)), short(throttleConfig("sliding_log", "5s", "fail_closed", 1000)))
	for g, mode := range []string{"fail_open", "fail_closed"} {
		user := "fails-" + mode
		// 120 at 50 a second: 50 pass, 70 are held for 1 and 2 s.
		var held []result
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 120 {
			wg.Go(func() {
				r := d.get(g, "/t", user)
				mu.Lock()
				held = append(held, r)
				mu.Unlock()
			})
		}
		deadline := time.Now().Add(5 * time.Second)
		waiting := func() int64 { n, _ := d.hosts[g].Metric("sluice_throttle_waiting"); return n }
		for waiting() < 70 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d held, want 70", mode, waiting())
			}
			time.Sleep(5 * time.Millisecond)
		}
		d.bridges[0].stop()
		failed := d.get(g, "/t", user+"-new")
		want := map[string]int{"fail_open": 200, "fail_closed": 503}[mode]
		if failed.status != want || failed.took() > timeout+300*time.Millisecond {
			t.Errorf("%s: a request with the bridge down: status %d after %v, want %d within the timeout", mode, failed.status, failed.took(), want)
		}
		wg.Wait()
		if st := statuses(held); st[200] != 120 {
			t.Errorf("%s: held requests: %v, want all 120 passed", mode, st)
		}
		slots := slotsOf(t, single(rs), keyOf(user, "t", "sl"))
		if len(slots) != 120 {
			t.Fatalf("%s: %d slots", mode, len(slots))
		}
		lateness(t, unixMS(d.passes.of("/t", user)), slots)
		d.bridges[0].start()
	}
}

// TestThrottle_ClientLeaves: clients that give up while held free their
// places in the waiting bound at once (their slots stay taken), so the
// next requests are held rather than refused.
func TestThrottle_ClientLeaves(t *testing.T) {
	t.Parallel() // they wait for slots: side by side they take a fraction of the time
	rs := redistest.Start(t)
	d := deployVMs(t, 1, rs.URL, 1, exactRedisTimeout, throttleConfig("sliding_log", "20s", "fail_closed", 5))
	h, user := d.hosts[0], "leaves"
	waiting := func() int64 { n, _ := h.Metric("sluice_throttle_waiting"); return n }
	if st := statuses(d.burst(50, 50, "/t", user)); st[200] != 50 {
		t.Fatalf("the first 50: %v", st)
	}
	// Five clients that wait 300 ms for answers a second away.
	impatient := &http.Client{Timeout: 300 * time.Millisecond}
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", d.gateways[0]+"/t", nil)
			req.Header.Set("X-User-Id", user)
			if res, err := impatient.Do(req); err == nil {
				res.Body.Close()
				t.Errorf("a held request answered %d within 300 ms", res.StatusCode)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for waiting() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d still held after their clients left", waiting())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Their places are free: five more are held (behind their slots), not refused.
	rs5 := d.burst(5, 5, "/t", user)
	if st := statuses(rs5); st[200] != 5 {
		t.Fatalf("after the clients left: %v, want 5 held and passed", st)
	}
	for _, r := range rs5 {
		if r.delayMS == 0 {
			t.Errorf("passed at once: want held for the next second")
		}
	}
	if n := len(slotsOf(t, single(rs), keyOf(user, "t", "sl"))); n != 60 {
		t.Errorf("%d slots taken, want 60: the slots of the clients that left stay taken", n)
	}
	if full, _ := h.Metric("sluice_throttle_full_total"); full != 0 {
		t.Errorf("%d refused for a full bound", full)
	}
}
