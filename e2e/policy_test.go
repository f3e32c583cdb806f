package e2e_test

// Rules from the policy store reach the proxies: two bridges on one
// PostgreSQL, two gateways (the built plugin in wasmhost, two worker VMs
// each), each gateway asking its own bridge (rules_from). A rule changed
// through one bridge's API is enforced by both gateways.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/redisbridge/pgtest"
	"github.com/sluicehq/sluice/wasmhost"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const policyAdminKey = "policy-admin-key-0123456789"

// policyStack is two bridges on one policy store and a gateway on each.
type policyStack struct {
	t        testing.TB
	bridges  []string // base URLs
	gateways []*httptest.Server
	hosts    []*wasmhost.Host

	mu      sync.Mutex
	applied map[[2]int]appliedAt // (gateway, vm) → the last version applied
	changed chan struct{}
}

type appliedAt struct {
	version int64
	at      time.Time
}

var appliedLine = regexp.MustCompile(`policy from the bridge applied: version (\d+)`)

func newPolicyStack(t testing.TB, interval string) *policyStack {
	t.Helper()
	url := pgtest.Shared(t).NewDatabase(t)
	ps := &policyStack{t: t, applied: map[[2]int]appliedAt{}, changed: make(chan struct{}, 1)}
	log := e2etest.Logger(t)
	for i := 0; i < 2; i++ {
		set := redisbridge.DefaultSettings()
		set.AdminKey = policyAdminKey
		set.PolicyStore = url
		set.Logger = log.With("bridge", i)
		set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
		br, err := redisbridge.New(set)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go br.Serve(ln)
		t.Cleanup(func() { stopBridge(br) })
		ps.bridges = append(ps.bridges, "http://"+ln.Addr().String())
	}
	config := `{
  "bridge": {"cluster": "sluice_bridge", "timeout": "500ms"},
  "identity": {"client_ip": {"trusted_proxy_depth": 1}},
  "rules_from": {"interval": "` + interval + `"},
  "rules": [{"name": "own", "match": {"paths": ["/own"]}, "scope": "ip", "limit": 1000, "window": "1m"}]
}`
	for g := 0; g < 2; g++ {
		host, err := wasmhost.New(context.Background(), e2etest.Plugin(t), wasmhost.Options{
			Workers: 2, PluginConfig: []byte(config), RootID: "sluice", CompilationCache: e2etest.CompilationCache(t),
			Clusters: map[string]string{"sluice_bridge": ps.bridges[g]},
			OnLog: func(e wasmhost.LogEntry) {
				m := appliedLine.FindStringSubmatch(e.Message)
				if m == nil {
					return
				}
				v, _ := strconv.ParseInt(m[1], 10, 64)
				ps.mu.Lock()
				ps.applied[[2]int{g, e.VM}] = appliedAt{v, e.Time}
				ps.mu.Unlock()
				select {
				case ps.changed <- struct{}{}:
				default:
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { host.Close() })
		gw := httptest.NewServer(host.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "upstream")
		})))
		t.Cleanup(gw.Close)
		ps.hosts = append(ps.hosts, host)
		ps.gateways = append(ps.gateways, gw)
	}
	return ps
}

// admin sends an admin request to bridge i and returns the policy
// version it answered and when.
func (ps *policyStack) admin(i int, method, path, body string) (int64, time.Time) {
	ps.t.Helper()
	req, _ := http.NewRequest(method, ps.bridges[i]+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+policyAdminKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		ps.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	at := time.Now()
	if res.StatusCode != 200 {
		ps.t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	m := regexp.MustCompile(`"version":(\d+)`).FindSubmatch(b)
	v, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return v, at
}

// waitApplied waits until every VM of both gateways applied version v and
// returns how long after since each did.
func (ps *policyStack) waitApplied(v int64, since time.Time, within time.Duration) []time.Duration {
	ps.t.Helper()
	deadline := time.After(within)
	for {
		ps.mu.Lock()
		var lags []time.Duration
		for g := range ps.hosts {
			for vm := 0; vm < ps.hosts[g].Workers(); vm++ {
				if a := ps.applied[[2]int{g, vm}]; a.version >= v {
					lags = append(lags, a.at.Sub(since))
				}
			}
		}
		ps.mu.Unlock()
		if len(lags) == 4 {
			sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
			return lags
		}
		select {
		case <-ps.changed:
		case <-deadline:
			ps.t.Fatalf("version %d applied by %d of 4 VMs within %v", v, len(lags), within)
		}
	}
}

// get sends GET path through gateway g as from client ip.
func (ps *policyStack) get(g int, path, ip string) (int, string) {
	ps.t.Helper()
	req, _ := http.NewRequest("GET", ps.gateways[g].URL+path, nil)
	req.Header.Set("X-Forwarded-For", ip)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		ps.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestFullStack_RuleReachesTwoGatewaysThroughTheBridge(t *testing.T) {
	ps := newPolicyStack(t, "200ms")
	// A rule put through the first bridge.
	v, at := ps.admin(0, "PUT", "/v1/rate-limit/rules/api", `{"name":"api","match":{"paths":["/api/**"]},"scope":"ip","limit":2,"window":"1m","algorithm":"fixed_window"}`)
	lags := ps.waitApplied(v, at, 10*time.Second)
	t.Logf("version %d in force in all 4 VMs of both gateways %v after the API answered (interval 200ms)", v, lags[3])
	for g, ip := range []string{"198.51.100.1", "198.51.100.2"} {
		for i, want := range []int{200, 200, 429} {
			status, body := ps.get(g, "/api/x", ip)
			if status != want || (want == 429 && !strings.Contains(body, `"rule":"api"`)) {
				t.Fatalf("gateway %d request %d: %d %s", g, i+1, status, body)
			}
		}
		// The gateway's own rule still applies.
		if status, _ := ps.get(g, "/own", ip); status != 200 {
			t.Fatalf("gateway %d /own: %d", g, status)
		}
	}

	// Changed through the second bridge, then deleted.
	v, at = ps.admin(1, "PUT", "/v1/rate-limit/rules/api", `{"name":"api","match":{"paths":["/api/**"]},"scope":"ip","limit":3,"window":"1m","algorithm":"fixed_window"}`)
	ps.waitApplied(v, at, 10*time.Second)
	for g, ip := range []string{"198.51.100.3", "198.51.100.4"} {
		for i, want := range []int{200, 200, 200, 429} {
			if status, body := ps.get(g, "/api/x", ip); status != want {
				t.Fatalf("limit 3, gateway %d request %d: %d %s", g, i+1, status, body)
			}
		}
	}
	v, at = ps.admin(0, "DELETE", "/v1/rate-limit/rules/api", "")
	ps.waitApplied(v, at, 10*time.Second)
	for g := range ps.gateways {
		for i := 0; i < 5; i++ {
			if status, body := ps.get(g, "/api/x", "198.51.100.5"); status != 200 {
				t.Fatalf("deleted rule, gateway %d request %d: %d %s", g, i+1, status, body)
			}
		}
	}
	for g, h := range ps.hosts {
		if n, _ := h.Metric("sluice_policy_refused_total"); n != 0 {
			t.Errorf("gateway %d refused %d policies", g, n)
		}
	}
}

// BenchmarkPolicy_ReachesProxies measures how long after the rules API
// answers a change is known to the other bridge (through NOTIFY) and in
// force in every worker VM of two gateways, each following its own
// bridge, with rules_from.interval 1s: the bound is interval + 1 s.
// Changes are made at random moments of the interval. Reported: the
// slowest and the mean lag of the last VM, and the mean lag of the other
// bridge (read from its /readyz every millisecond).
func BenchmarkPolicy_ReachesProxies(b *testing.B) {
	ps := newPolicyStack(b, "1s")
	var worst, sum, bridgeSum time.Duration
	for i := 0; b.Loop(); i++ {
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
		body := fmt.Sprintf(`{"name":"api","match":{"paths":["/api/**"]},"scope":"ip","limit":%d,"window":"1m"}`, i+1)
		v, at := ps.admin(i%2, "PUT", "/v1/rate-limit/rules/api", body)
		bridgeSum += ps.waitBridge(1-i%2, v, at)
		lags := ps.waitApplied(v, at, 30*time.Second)
		sum += lags[3]
		worst = max(worst, lags[3])
	}
	b.ReportMetric(float64(worst.Milliseconds()), "ms-worst-all-VMs")
	b.ReportMetric(float64(sum.Milliseconds())/float64(b.N), "ms-mean-all-VMs")
	b.ReportMetric(float64(bridgeSum.Microseconds())/1000/float64(b.N), "ms-mean-other-bridge")
}

// waitBridge polls bridge i's /readyz until it reports version v and
// returns how long after since that was.
func (ps *policyStack) waitBridge(i int, v int64, since time.Time) time.Duration {
	want := regexp.MustCompile(fmt.Sprintf(`"version":%d\b`, v))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		res, err := http.Get(ps.bridges[i] + "/readyz")
		if err != nil {
			ps.t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want.Match(b) {
			return time.Since(since)
		}
	}
	ps.t.Fatalf("bridge %d never reported version %d", i, v)
	return 0
}
