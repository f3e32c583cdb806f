package distributed

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

const (
	// calloutTimeout is the plugin's bridge.timeout in the fault tests.
	calloutTimeout = 400 * time.Millisecond
	// faultRedisTimeout is the bridges' Redis timeout: below the call-out
	// timeout, so that a slow or dead Redis is answered by the bridge (503)
	// before the plugin gives up.
	faultRedisTimeout = 250 * time.Millisecond
	// margin is what a request may take beyond the call-out timeout: the
	// gateway, the wasm VMs, the clients and the Redis processes share a
	// loaded machine.
	margin = 600 * time.Millisecond
	// strayShare is the share of answers outside a fault that may still be
	// degraded: on a loaded machine a Redis call can exceed its timeout.
	strayShare = 0.05
	// smallLimit is the limit checked for exactness after each recovery.
	smallLimit = 30
)

// faultConfig: a per-user limit no load test reaches (/load), a sliding log
// whose entries count the admitted requests (/tally), and a small limit
// (/small). No local cache: every request asks the bridge, so every
// degraded answer is seen.
func faultConfig(mode string) string {
	return `{
  "failure_mode": "` + mode + `",
  "bridge": {"cluster": "sluice_bridge", "timeout": "` + calloutTimeout.String() + `"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "local_cache": {"enabled": false},
  "rules": [
    {"name": "load", "scope": "user", "algorithm": "fixed_window", "limit": 1000000000, "window": "1h", "match": {"paths": ["/load"]}},
    {"name": "tally", "scope": "user", "algorithm": "sliding_log", "limit": 100000, "window": "1h", "match": {"paths": ["/tally"]}},
    {"name": "small", "scope": "user", "algorithm": "fixed_window", "limit": ` + fmt.Sprint(smallLimit) + `, "window": "1h", "match": {"paths": ["/small"]}}
  ]
}`
}

const (
	openHost   = 0 // fail_open
	closedHost = 1 // fail_closed
)

type sample struct {
	result
	host  int
	tally bool
}

// load is steady traffic through both hosts while a fault happens: per host
// 4 clients on /load with 64 users each (spread over cluster slots), and on
// the fail_closed host one client on /tally with one user.
type load struct {
	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	wg      sync.WaitGroup
}

func (d *deployment) startLoad(tag string) *load {
	l := &load{stop: make(chan struct{})}
	run := func(host int, tally bool, user func(i int) string) {
		defer l.wg.Done()
		path := "/load"
		if tally {
			path = "/tally"
		}
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			r := d.get(host, path, user(i))
			l.mu.Lock()
			l.samples = append(l.samples, sample{r, host, tally})
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}
	for host := range d.gateways {
		for g := 0; g < 4; g++ {
			l.wg.Add(1)
			go run(host, false, func(i int) string { return fmt.Sprintf("%s-%d-%d-%d", tag, host, g, i%64) })
		}
	}
	l.wg.Add(1)
	go run(closedHost, true, func(int) string { return tag + "-tally" })
	return l
}

func (l *load) end() []sample {
	close(l.stop)
	l.wg.Wait()
	return l.samples
}

// waitDecided waits until both hosts get decisions from the bridge again.
func (d *deployment) waitDecided(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for host := range d.gateways {
		for {
			if r := d.get(host, "/load", "probe"); r.status == 200 && r.decided {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("host %d: no decision from the bridge within %v of the recovery", host, within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// faultRun is a fault's figures.
type faultRun struct {
	requests, degraded [2]int
	window             [2]time.Duration // fault → first decision after the last degraded answer
	p99, max           time.Duration
	tallyAdmitted      int
	tallyFailed        int
}

// analyze checks every answer of a run with the fault injected at t0 and
// both hosts decided again at recovered: the configured answer (fail_open:
// 200; fail_closed: 503 when the bridge could not decide) within the
// call-out timeout plus margin; degraded answers outside the fault at most
// strayShare; and a decided answer after the fault's last degraded one.
func analyze(t *testing.T, name string, samples []sample, t0, recovered time.Time) faultRun {
	t.Helper()
	var fr faultRun
	var lastDegraded [2]time.Time
	var lat []time.Duration
	slow, outside, stray := 0, 0, 0
	for _, s := range samples {
		if s.err != nil {
			t.Fatalf("host %d: the gateway did not answer: %v", s.host, s.err)
		}
		fr.requests[s.host]++
		lat = append(lat, s.took())
		if s.took() > calloutTimeout+margin {
			if slow++; slow <= 5 {
				t.Errorf("host %d: an answer took %v, more than the timeout %v + %v", s.host, s.took(), calloutTimeout, margin)
			}
		}
		degraded := false
		switch {
		case s.status == 200 && s.decided:
		case s.host == openHost && s.status == 200:
			degraded = true
		case s.host == closedHost && s.status == 503 && !s.decided:
			degraded = true
		default:
			t.Fatalf("host %d: status %d (decided %v), not a configured answer", s.host, s.status, s.decided)
		}
		if s.tally && s.status == 200 {
			fr.tallyAdmitted++
		}
		if s.tally && degraded {
			fr.tallyFailed++
		}
		if s.end.Before(t0) || s.start.After(recovered) {
			outside++
			if degraded {
				stray++
			}
			continue
		}
		if degraded {
			fr.degraded[s.host]++
			if s.start.After(lastDegraded[s.host]) {
				lastDegraded[s.host] = s.start
			}
		}
	}
	if float64(stray) > strayShare*float64(outside) {
		t.Errorf("%d of %d answers outside the fault were degraded", stray, outside)
	}
	for host := range fr.window {
		if fr.degraded[host] == 0 {
			continue
		}
		var first time.Time
		for _, s := range samples {
			if s.host == host && s.decided && s.start.After(lastDegraded[host]) && (first.IsZero() || s.end.Before(first)) {
				first = s.end
			}
		}
		if first.IsZero() {
			t.Errorf("host %d: no decision after the last degraded answer", host)
			continue
		}
		fr.window[host] = first.Sub(t0)
	}
	fr.p99, fr.max = percentile(lat, 99), percentile(lat, 100)
	t.Logf("%s: fail_open host %d requests, %d passed undecided, degraded for %v; fail_closed host %d requests, %d answered 503, degraded for %v; %d of %d answers outside the fault degraded; latency p99 %v max %v",
		name, fr.requests[openHost], fr.degraded[openHost], fr.window[openHost].Round(time.Millisecond),
		fr.requests[closedHost], fr.degraded[closedHost], fr.window[closedHost].Round(time.Millisecond),
		stray, outside, fr.p99.Round(time.Millisecond), fr.max.Round(time.Millisecond))
	return fr
}

// exactAfter checks that after a recovery a fresh key admits exactly the
// limit to concurrent clients. A 503 (a Redis call over its timeout on a
// loaded machine) may have consumed a unit, so with failures the admitted
// count may only be lower.
func (d *deployment) exactAfter(t *testing.T, user string) {
	t.Helper()
	st := statuses(d.burstVia(closedHost, 16, smallLimit+15, "/small", user))
	switch {
	case st[200] > smallLimit || st[200]+st[429]+st[503] != smallLimit+15:
		t.Errorf("after recovery: statuses %v, want at most %d admitted", st, smallLimit)
	case st[503] == 0 && st[200] != smallLimit:
		t.Errorf("after recovery: statuses %v, want exactly %d admitted", st, smallLimit)
	case st[503] > 0:
		t.Logf("after recovery: statuses %v (bridge failures on a loaded machine)", st)
	}
}

// faultCase runs load, injects a fault at t0 and waits for recovery, then
// analyzes. inject returns when the fault is over (recovery started).
func faultCase(t *testing.T, d *deployment, tag string, inject func()) faultRun {
	t.Helper()
	l := d.startLoad(tag)
	time.Sleep(400 * time.Millisecond)
	t0 := time.Now()
	inject()
	d.waitDecided(t, 15*time.Second)
	recovered := time.Now()
	time.Sleep(500 * time.Millisecond)
	fr := analyze(t, tag, l.end(), t0, recovered)
	for host, n := range fr.degraded {
		if n == 0 {
			t.Errorf("host %d: the fault degraded no answer: was it injected?", host)
		}
	}
	return fr
}

// tally compares the admitted /tally requests with the entries in Redis.
func tally(t *testing.T, at redisAt, tag string, fr faultRun) (inRedis int64) {
	t.Helper()
	inRedis = doInt(t, at, "ZCARD", keyOf(tag+"-tally", "tally", "sl"))
	t.Logf("%s: tally: %d admitted, %d in Redis, %d failed answers", tag, fr.tallyAdmitted, inRedis, fr.tallyFailed)
	return inRedis
}

// checkNoLoss: a fault that loses no Redis data leaves every admitted
// request counted; requests that got a failure answer may be counted too
// (their script ran, the answer came too late): counting errs toward limiting.
func checkNoLoss(t *testing.T, at redisAt, tag string, fr faultRun) {
	t.Helper()
	n := tally(t, at, tag, fr)
	if n < int64(fr.tallyAdmitted) || n > int64(fr.tallyAdmitted+fr.tallyFailed) {
		t.Errorf("%d entries in Redis for %d admitted and %d failed requests", n, fr.tallyAdmitted, fr.tallyFailed)
	}
}

// redisRestart: Redis stops for a second and comes back empty; every
// request gets its host's failure mode meanwhile, within the timeout.
func redisRestart(t *testing.T, d *deployment, rs *redistest.Server, at redisAt) {
	fr := faultCase(t, d, "restart", func() {
		rs.Stop()
		time.Sleep(time.Second)
		rs.Restart()
	})
	// Without persistence the restart loses every count: only the
	// requests admitted after it are in Redis.
	n := tally(t, at, "restart", fr)
	if n > int64(fr.tallyAdmitted) {
		t.Errorf("%d entries in Redis, more than the %d admitted", n, fr.tallyAdmitted)
	}
	d.exactAfter(t, "restart-small")
}

// TestFaults_SingleRedisEmbedded: Redis down under hosts that each embed
// their bridge (the gateway's --embed-bridge) is answered as with bridges
// of their own.
func TestFaults_SingleRedisEmbedded(t *testing.T) {
	rs := redistest.Start(t)
	d := deploy(t, rs.URL, 0, faultRedisTimeout, faultConfig("fail_open"), faultConfig("fail_closed"))
	d.waitDecided(t, 5*time.Second)
	redisRestart(t, d, rs, single(rs))
}

func TestFaults_SingleRedis(t *testing.T) {
	rs := redistest.Start(t)
	d := deploy(t, rs.URL, bridgeCount, faultRedisTimeout, faultConfig("fail_open"), faultConfig("fail_closed"))
	at := single(rs)
	d.waitDecided(t, 5*time.Second)

	t.Run("redis stopped and started", func(t *testing.T) { redisRestart(t, d, rs, at) })

	t.Run("redis slow", func(t *testing.T) {
		fr := faultCase(t, d, "pause", func() {
			// CLIENT PAUSE stalls every client for 1 s, as a blocking
			// command or a fork would.
			if _, err := redistest.Do(rs.Addr, time.Second, "CLIENT", "PAUSE", "1000", "ALL"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		})
		checkNoLoss(t, at, "pause", fr)
		d.exactAfter(t, "pause-small")
	})

	t.Run("bridges killed and restarted", func(t *testing.T) {
		fr := faultCase(t, d, "bridges", func() {
			for _, b := range d.bridges {
				b.stop()
			}
			time.Sleep(time.Second)
			for _, b := range d.bridges {
				b.start()
			}
		})
		checkNoLoss(t, at, "bridges", fr)
		d.exactAfter(t, "bridges-small")
	})

	t.Run("bridge slower than the timeout", func(t *testing.T) {
		fr := faultCase(t, d, "slowbridge", func() {
			for _, p := range d.proxies {
				p.setDelay(2 * calloutTimeout)
			}
			time.Sleep(time.Second)
			for _, p := range d.proxies {
				p.setDelay(0)
			}
		})
		checkNoLoss(t, at, "slowbridge", fr)
		d.exactAfter(t, "slowbridge-small")
	})
}

func TestFaults_ClusterMasterKilled(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	d := deploy(t, c.URL, bridgeCount, faultRedisTimeout, faultConfig("fail_open"), faultConfig("fail_closed"))
	at := onCluster(t, c)
	d.waitDecided(t, 5*time.Second)
	key := keyOf("failover-tally", "tally", "sl")
	var promoted time.Duration
	fr := faultCase(t, d, "failover", func() {
		old, err := c.KillMasterOf(key)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := c.WaitFailover(key, old, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		promoted = time.Since(start)
	})
	t.Logf("replica promoted %v after the kill", promoted.Round(time.Millisecond))
	n := tally(t, at, "failover", fr)
	t.Logf("failover: %d admitted increments lost with the master (async replication)", max(0, int64(fr.tallyAdmitted)-n))
	if n > int64(fr.tallyAdmitted+fr.tallyFailed) {
		t.Errorf("%d entries in Redis for %d admitted and %d failed requests", n, fr.tallyAdmitted, fr.tallyFailed)
	}
	d.exactAfter(t, "failover-small")
}

func TestFaults_SentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	d := deploy(t, st.URL, bridgeCount, faultRedisTimeout, faultConfig("fail_open"), faultConfig("fail_closed"))
	d.waitDecided(t, 5*time.Second)
	var newMaster *redistest.Server
	var promoted time.Duration
	fr := faultCase(t, d, "sentinel", func() {
		old := st.Master
		old.Stop()
		start := time.Now()
		var err error
		if newMaster, err = st.WaitMaster(old.Addr, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		promoted = time.Since(start)
	})
	t.Logf("sentinels promoted the replica %v after the kill", promoted.Round(time.Millisecond))
	n := tally(t, single(newMaster), "sentinel", fr)
	t.Logf("sentinel: %d admitted increments lost with the master (async replication)", max(0, int64(fr.tallyAdmitted)-n))
	if n > int64(fr.tallyAdmitted+fr.tallyFailed) {
		t.Errorf("%d entries in Redis for %d admitted and %d failed requests", n, fr.tallyAdmitted, fr.tallyFailed)
	}
	d.exactAfter(t, "sentinel-small")
}
