package distributed

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/wasmhost"
)

// builtPlugin is the plugin as `make wasm` builds it.
func builtPlugin(t *testing.T) []byte { return e2etest.Plugin(t) }

// bridgeProc is one bridge replica on a fixed loopback address.
type bridgeProc struct {
	t        testing.TB
	addr     string
	redisURL string
	timeout  time.Duration // Settings.RedisTimeout
	batch    int           // Settings.RedisBatch; 0: the default
	log      *slog.Logger  // kept across restarts, shown if the test fails
	mu       sync.Mutex
	srv      *redisbridge.Server
}

func startBridge(t testing.TB, redisURL string, redisTimeout time.Duration) *bridgeProc {
	return startBridgeBatch(t, redisURL, redisTimeout, 0)
}

// startBridgeBatch is startBridge deciding at most batch checks per
// script call (--redis-batch; 0: the default).
func startBridgeBatch(t testing.TB, redisURL string, redisTimeout time.Duration, batch int) *bridgeProc {
	t.Helper()
	b := &bridgeProc{t: t, addr: nettest.FreeAddr(t), redisURL: redisURL, timeout: redisTimeout, batch: batch, log: e2etest.Logger(t)}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *bridgeProc) start() {
	b.t.Helper()
	set := redisbridge.DefaultSettings()
	set.Listen, set.Store, set.RedisURL = b.addr, "redis", b.redisURL
	set.RedisTimeout = b.timeout
	if b.batch > 0 {
		set.RedisBatch = b.batch
	}
	set.Logger = b.log
	set.AuditLog = filepath.Join(b.t.TempDir(), "audit.log")
	srv, err := redisbridge.New(set)
	if err != nil {
		b.t.Fatal(err)
	}
	var ln net.Listener
	for i := 0; i < 100; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", b.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	go srv.Serve(ln)
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
}

// embeddedBridge is a bridge on Redis for a host to serve in process,
// until t ends.
func embeddedBridge(t *testing.T, redisURL string, redisTimeout time.Duration) http.Handler {
	t.Helper()
	set := redisbridge.DefaultSettings()
	set.Store, set.RedisURL, set.RedisTimeout = "redis", redisURL, redisTimeout
	set.Logger = e2etest.Logger(t)
	set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	srv, err := redisbridge.New(set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Handler()
}

// stop stops the bridge at once, as a crash would for its clients.
func (b *bridgeProc) stop() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv == nil {
		return
	}
	// Shutdown closes the listener; a short grace then drops the
	// connections in flight, as a crash would.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	srv.Shutdown(ctx)
	srv.Close()
}

// delayProxy forwards TCP connections to a target, delaying every chunk
// sent towards the target by a delay that tests change at run time: a
// bridge that is slow, or a slow network, as the plugin sees it.
type delayProxy struct {
	addr   string
	target string
	delay  atomic.Int64 // nanoseconds
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func startProxy(t *testing.T, target string) *delayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *delayProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *delayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *delayProxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	if !p.track(c) {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		return // the bridge is down: the client sees the connection close
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(c, up)
		c.Close()
		close(done)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := up.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	<-done
}

func (p *delayProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// spread sends each call-out to the next bridge replica in turn: the load
// balancing a proxy's upstream cluster does over the bridge's endpoints.
type spread struct {
	addrs []string
	next  atomic.Uint64
	base  http.RoundTripper
}

func (s *spread) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.URL.Host = s.addrs[s.next.Add(1)%uint64(len(s.addrs))]
	return s.base.RoundTrip(r)
}

// deployment is bridges (each behind a delaying proxy) on one Redis
// topology, and plugin hosts (two VMs each) whose call-outs are spread over
// the bridges, each host behind a gateway.
type deployment struct {
	t        *testing.T
	bridges  []*bridgeProc
	proxies  []*delayProxy
	hosts    []*wasmhost.Host
	gateways []string
	client   *http.Client
	passes   passLog // when requests reached the upstream
}

// passLog records when requests reached the upstream, by path and user.
type passLog struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (l *passLog) add(key string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = map[string][]time.Time{}
	}
	l.at[key] = append(l.at[key], t)
}

// of returns the times requests of user for path reached the upstream,
// in order.
func (l *passLog) of(path, user string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.at[path+" "+user])
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// deploy starts the bridges with the given Redis timeout and one host of
// two worker VMs per plugin configuration. With bridges 0, each host has a
// bridge of its own in its process instead (wasmhost.Options.Handlers, as
// the gateway's --embed-bridge), on the same Redis.
func deploy(t *testing.T, redisURL string, bridges int, redisTimeout time.Duration, configs ...string) *deployment {
	t.Helper()
	return deployVMs(t, 2, redisURL, bridges, redisTimeout, configs...)
}

// deployVMs is deploy with hosts of workers VMs each.
func deployVMs(t *testing.T, workers int, redisURL string, bridges int, redisTimeout time.Duration, configs ...string) *deployment {
	t.Helper()
	d := &deployment{t: t}
	var addrs []string
	for i := 0; i < bridges; i++ {
		b := startBridge(t, redisURL, redisTimeout)
		p := startProxy(t, b.addr)
		d.bridges, d.proxies = append(d.bridges, b), append(d.proxies, p)
		addrs = append(addrs, p.addr)
	}
	for _, cfg := range configs {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		tr.DisableCompression = true
		t.Cleanup(tr.CloseIdleConnections)
		opts := wasmhost.Options{
			Workers: workers, PluginConfig: []byte(cfg), RootID: "sluice", CompilationCache: e2etest.CompilationCache(t),
			Clusters:   map[string]string{"sluice_bridge": "http://sluice-bridge"},
			HTTPClient: &http.Client{Transport: &spread{addrs: addrs, base: tr}},
		}
		if bridges == 0 {
			opts.Clusters, opts.HTTPClient = nil, nil
			opts.Handlers = map[string]http.Handler{"sluice_bridge": embeddedBridge(t, redisURL, redisTimeout)}
		}
		h, err := wasmhost.New(context.Background(), builtPlugin(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if n := h.Failures(); n != 0 {
				t.Errorf("plugin VM crashes: %d", n)
			}
			h.Close()
		})
		gw := httptest.NewServer(h.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d.passes.add(r.URL.Path+" "+r.Header.Get("X-User-Id"), time.Now())
			io.WriteString(w, "upstream")
		})))
		t.Cleanup(gw.Close)
		d.hosts, d.gateways = append(d.hosts, h), append(d.gateways, gw.URL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	t.Cleanup(tr.CloseIdleConnections)
	d.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return d
}

// result is what a client saw for one request.
type result struct {
	start, end time.Time
	status     int
	decided    bool  // the bridge decided: rate limit headers present
	reset      int64 // X-RateLimit-Reset
	delayMS    int64 // X-RateLimit-Delay: how long a throttle limit held it
	err        error
}

func (r result) took() time.Duration { return r.end.Sub(r.start) }

// get sends GET path as user through gateway g.
func (d *deployment) get(g int, path, user string) result {
	req, _ := http.NewRequest("GET", d.gateways[g]+path, nil)
	req.Header.Set("X-User-Id", user)
	r := result{start: time.Now()}
	res, err := d.client.Do(req)
	if err != nil {
		r.end, r.err = time.Now(), err
		return r
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	r.end, r.status = time.Now(), res.StatusCode
	r.decided = res.Header.Get("X-RateLimit-Limit") != ""
	r.reset, _ = strconv.ParseInt(res.Header.Get("X-RateLimit-Reset"), 10, 64)
	r.delayMS, _ = strconv.ParseInt(res.Header.Get("X-RateLimit-Delay"), 10, 64)
	return r
}

// burst sends n requests from clients concurrent clients, spread over the
// gateways, and returns the results in no particular order.
func (d *deployment) burst(clients, n int, path, user string) []result {
	return d.burstVia(-1, clients, n, path, user)
}

// burstVia is burst through gateway g only (all when g < 0).
func (d *deployment) burstVia(g, clients, n int, path, user string) []result {
	var next atomic.Int64
	out := make([]result, n)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				gw := g
				if gw < 0 {
					gw = i % len(d.gateways)
				}
				out[i] = d.get(gw, path, user)
			}
		}()
	}
	wg.Wait()
	return out
}

// statuses counts results by status; transport errors count as status 0.
func statuses(rs []result) map[int]int {
	m := map[int]int{}
	for _, r := range rs {
		m[r.status]++
	}
	return m
}

// redisAt names the Redis that holds a key (the slot's master on a cluster).
type redisAt func(key string) string

func single(s *redistest.Server) redisAt { return func(string) string { return s.Addr } }

func onCluster(t *testing.T, c *redistest.Cluster) redisAt {
	return func(key string) string {
		m, err := c.MasterOf(key)
		if err != nil {
			t.Fatalf("master of %s: %v", key, err)
		}
		return m.Addr
	}
}

func doInt(t *testing.T, at redisAt, args ...string) int64 {
	t.Helper()
	v, err := redistest.DoString(at(args[1]), time.Second, args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	n, _ := strconv.ParseFloat(v, 64)
	return int64(n)
}

// percentile returns the p-th percentile (0..100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func keyOf(user, rule, suffix string) string {
	return "rl:{u:" + user + "}:" + rule + ":" + suffix
}
