package wasmhost

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/sluicehq/sluice/internal/hosttest"
)

var (
	guestWasm []byte
	cache     = wazero.NewCompilationCache()
)

func TestMain(m *testing.M) {
	var err error
	if guestWasm, err = hosttest.Guest(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func newHost(t testing.TB, opts Options) *Host {
	t.Helper()
	if opts.CompilationCache == nil {
		opts.CompilationCache = cache
	}
	h, err := New(context.Background(), guestWasm, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// run sends one request with headers through a stream and closes it.
func run(t testing.TB, h *Host, headers ...string) (Result, error) {
	t.Helper()
	var hs [][2]string
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, [2]string{headers[i], headers[i+1]})
	}
	s := h.NewStream(context.Background(), RequestInfo{
		Method: "GET", Path: "/api/items?x=1", Host: "example.com", Headers: hs,
		SourceAddress: "203.0.113.7:4321", RequestID: "req-1", ConnectionID: 77, EndOfStream: true,
	})
	defer s.Close()
	return s.RequestHeaders(context.Background())
}

func mustGet(t testing.TB, r Result, name string) string {
	t.Helper()
	v, ok := r.Get(name)
	if !ok {
		t.Fatalf("header %q missing from %v", name, r.Headers)
	}
	return v
}

func TestHost_RequestHeadersAndProperties(t *testing.T) {
	h := newHost(t, Options{PluginConfig: []byte("cfg-1"), VMConfig: []byte("vm-cfg"), RootID: "root-x", VMID: "vm-x"})
	r, err := run(t, h, "x-mode", "echo", "X-Remove-Me", "secret", "x-user", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if r.Local != nil {
		t.Fatalf("unexpected local response %+v", r.Local)
	}
	want := map[string]string{
		"x-config": "cfg-1", "x-vm-config": "vm-cfg", "x-eos": "true",
		"x-prop-source.address": "203.0.113.7:4321", "x-prop-source.port": "4321",
		"x-prop-request.path": "/api/items?x=1", "x-prop-request.url_path": "/api/items",
		"x-prop-request.method": "GET", "x-prop-request.host": "example.com",
		"x-prop-request.scheme": "http", "x-prop-request.protocol": "HTTP/1.1", "x-prop-request.id": "req-1",
		"x-prop-plugin_root_id": "root-x", "x-prop-plugin_name": "sluice", "x-prop-plugin_vm_id": "vm-x",
		"x-prop-connection.id": "77", "x-metric-requests": "1", "x-user": "alice",
		// No client certificate: no names of one, as Envoy.
		"x-prop-connection.uri_san_peer_certificate": "error: proxywasm: not found",
		"x-prop-connection.dns_san_peer_certificate": "error: proxywasm: not found",
		// :authority :path :method :scheme x-mode x-remove-me x-user x-request-id
		"x-num-headers": "8", ":path": "/api/items?x=1", "x-request-id": "req-1",
	}
	for k, v := range want {
		if got := mustGet(t, r, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for _, k := range []string{"x-remove-me", "x-prop-missing", "x-counter-negative"} {
		if v, ok := r.Get(k); ok {
			t.Errorf("%s present (%q)", k, v)
		}
	}
	var added []string
	for _, kv := range r.Headers {
		if kv[0] == "x-added" {
			added = append(added, kv[1])
		}
	}
	if strings.Join(added, ",") != "a,b" {
		t.Errorf("x-added = %v, want a,b", added)
	}
	now, _ := strconv.ParseInt(mustGet(t, r, "x-now"), 10, 64)
	if d := time.Since(time.Unix(0, now)); d < 0 || d > time.Minute {
		t.Errorf("x-now is %v away from now", d)
	}
}

// The names of a client certificate the listener verified are the
// connection's properties, as Envoy gives them: the first URI, the first
// DNS name, and none of a kind the certificate does not have.
func TestHost_PeerCertificateProperties(t *testing.T) {
	h := newHost(t, Options{})
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/shop/sa/checkout")
	other, _ := url.Parse("spiffe://cluster.local/ns/shop/sa/other")
	for _, tt := range []struct {
		name      string
		cert      *x509.Certificate
		uri, dnsN string
	}{
		{"both", &x509.Certificate{URIs: []*url.URL{spiffe, other}, DNSNames: []string{"checkout.shop", "x.shop"}}, spiffe.String(), "checkout.shop"},
		{"a DNS name only", &x509.Certificate{DNSNames: []string{"checkout.shop"}}, "error: proxywasm: not found", "checkout.shop"},
	} {
		s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", Host: "example.com", Headers: [][2]string{{"x-mode", "echo"}},
			EndOfStream: true, PeerCertificate: tt.cert})
		r, err := s.RequestHeaders(context.Background())
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if u, d := mustGet(t, r, "x-prop-connection.uri_san_peer_certificate"), mustGet(t, r, "x-prop-connection.dns_san_peer_certificate"); u != tt.uri || d != tt.dnsN {
			t.Errorf("%s: uri %q, dns %q; want %q, %q", tt.name, u, d, tt.uri, tt.dnsN)
		}
	}
}

func TestHost_InjectedClock(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	h := newHost(t, Options{Now: func() time.Time { return at }})
	r, err := run(t, h, "x-mode", "echo")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, r, "x-now"); got != strconv.FormatInt(at.UnixNano(), 10) {
		t.Fatalf("x-now = %s, want %d", got, at.UnixNano())
	}
}

func TestHost_LocalResponse(t *testing.T) {
	h := newHost(t, Options{})
	r, err := run(t, h, "x-mode", "deny")
	if err != nil {
		t.Fatal(err)
	}
	l := r.Local
	if l == nil || l.Status != 429 || string(l.Body) != "denied" || l.Details != "rate_limited" {
		t.Fatalf("local = %+v", l)
	}
	if v, _ := (Result{Headers: l.Headers}).Get("retry-after"); v != "7" {
		t.Fatalf("local headers = %v", l.Headers)
	}
}

func TestHost_ResponseHeaders(t *testing.T) {
	h := newHost(t, Options{})
	s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", Host: "h",
		Headers: [][2]string{{"x-mode", "echo"}}})
	defer s.Close()
	if _, err := s.RequestHeaders(context.Background()); err != nil {
		t.Fatal(err)
	}
	r, err := s.ResponseHeaders(context.Background(), 201, [][2]string{{"X-Secret", "s"}, {"x-replaced", "old"}, {"content-type", "text/plain"}})
	if err != nil {
		t.Fatal(err)
	}
	wantResp := map[string]string{":status": "201", "x-guest-saw-status": "201", "x-replaced": "new", "content-type": "text/plain"}
	for k, v := range wantResp {
		if got := mustGet(t, r, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if _, ok := r.Get("x-secret"); ok {
		t.Error("x-secret not removed")
	}
}

func TestStream_ResponseHeadersWithoutRequest(t *testing.T) {
	h := newHost(t, Options{})
	s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/"})
	defer s.Close()
	if _, err := s.ResponseHeaders(context.Background(), 200, nil); !errors.Is(err, errNoContext) {
		t.Fatalf("err = %v", err)
	}
}

// TestHost_Callout: call-outs and their failures as Envoy reports them
// (hosttest.Callouts), to clusters on TCP and on Unix sockets (Envoy's
// pipe addresses).
func TestHost_Callout(t *testing.T) {
	srv := hosttest.Backend(t)
	tlsSrv := httptest.NewTLSServer(srv.Config.Handler)
	defer tlsSrv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	for _, tc := range []struct {
		name     string
		clusters map[string]string
	}{
		{"tcp", map[string]string{"backend": srv.URL, "down": closedURL}},
		{"unix", unixClusters(t, srv.Config.Handler)},
		{"in-process", map[string]string{"down": closedURL}},
		{"https", map[string]string{"backend": tlsSrv.URL, "down": closedURL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Workers: 3, Clusters: tc.clusters}
			switch tc.name {
			case "in-process":
				opts.Handlers = map[string]http.Handler{"backend": srv.Config.Handler}
			case "https": // its certificate from a CA of its own
				roots := x509.NewCertPool()
				roots.AddCert(tlsSrv.Certificate())
				opts.TLSClientConfig = &tls.Config{RootCAs: roots}
			}
			testCallouts(t, newHost(t, opts))
		})
	}
}

// unixClusters serves h on a Unix socket as the cluster "backend", and
// names as "down" a socket nothing listens on.
func unixClusters(t testing.TB, h http.Handler) map[string]string {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "backend.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	down, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "down.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	down.SetUnlinkOnClose(false) // the socket stays, refusing connections
	down.Close()
	return map[string]string{"backend": "unix://" + filepath.Join(dir, "backend.sock"), "down": "unix://" + filepath.Join(dir, "down.sock")}
}

func testCallouts(t *testing.T, h *Host) {
	for _, tt := range hosttest.Callouts {
		t.Run(tt.Name, func(t *testing.T) { checkCallout(t, h, tt) })
	}
	r, _ := run(t, h, "x-mode", "callout", "x-callout-path", "/check/2")
	if got := mustGet(t, r, "x-callout-upstream"); got != "yes" {
		t.Errorf("call-out response header x-upstream (sent as X-Upstream) = %q", got)
	}
}

// checkCallout runs call-out tt through h and checks what the plugin got,
// as hosttest.Callout says.
func checkCallout(t *testing.T, h *Host, tt hosttest.Callout) {
	t.Helper()
	r, err := run(t, h, append([]string{"x-mode", "callout"}, tt.Headers...)...)
	if err != nil {
		t.Fatal(err)
	}
	if tt.Local == 0 {
		if r.Local != nil {
			t.Fatalf("local = %+v (%s)", r.Local, r.Local.Body)
		}
		if got := mustGet(t, r, "x-callout-body"); got != tt.Body {
			t.Errorf("x-callout-body = %q, want %q", got, tt.Body)
		}
		if got := mustGet(t, r, "x-callout-status"); got != tt.Status {
			t.Errorf("x-callout-status = %q, want %q", got, tt.Status)
		}
		return
	}
	if r.Local == nil || r.Local.Status != tt.Local || string(r.Local.Body) != tt.Body {
		t.Fatalf("local = %+v, want %d %q", r.Local, tt.Local, tt.Body)
	}
	if tt.Status != "" {
		if got, _ := (Result{Headers: r.Local.Headers}).Get("x-callout-failure"); got != tt.Status {
			t.Errorf("proxy_get_status = %q, want %q", got, tt.Status)
		}
	}
}

// A paused request's first call-out, when it has a timeout, goes out on
// the goroutine that waits for the request, which sees its context end
// once the call-out has ended; one without a timeout goes out on a worker,
// and the wait ends with the context at once.
func TestStream_PausedRequestHonoursContext(t *testing.T) {
	for _, tc := range []struct {
		timeout  string
		onStream bool
	}{{"5000", true}, {"0", false}} {
		t.Run("timeout "+tc.timeout, func(t *testing.T) {
			entered, release := make(chan bool, 1), make(chan struct{})
			h := newHost(t, Options{Handlers: map[string]http.Handler{"backend": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				entered <- strings.Contains(string(debug.Stack()), "(*Stream).RequestHeaders")
				<-release
			})}})
			s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", Host: "h",
				Headers: [][2]string{{"x-mode", "callout"}, {"x-timeout", tc.timeout}}})
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := s.RequestHeaders(ctx)
				done <- err
			}()
			if got := <-entered; got != tc.onStream {
				t.Errorf("call-out served on the stream's goroutine: %v, want %v", got, tc.onStream)
			}
			cancel()
			if !tc.onStream {
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("err = %v, want canceled", err)
				}
			}
			close(release)
			if tc.onStream {
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Errorf("err = %v, want canceled", err)
				}
			}
		})
	}
}

// A call-out from a callback that lets its stream go on is sent by a
// worker: the stream does not wait for it.
func TestStream_CalloutOfContinuedStream(t *testing.T) {
	entered := make(chan bool, 1)
	h := newHost(t, Options{Handlers: map[string]http.Handler{"backend": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- strings.Contains(string(debug.Stack()), "(*Stream).RequestHeaders")
	})}})
	r, err := run(t, h, "x-mode", "callout", "x-timeout", "5000", "x-then", "continue")
	if err != nil || r.Local != nil {
		t.Fatalf("result %+v, err %v", r, err)
	}
	select {
	case onStream := <-entered:
		if onStream {
			t.Error("call-out served on the stream's goroutine")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call-out was not sent")
	}
}

func TestHost_SharedDataCAS(t *testing.T) {
	h := newHost(t, Options{Workers: 2})
	r, err := run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if mustGet(t, r, "x-shared-old") != "<none>" || mustGet(t, r, "x-shared-result") != "ok" {
		t.Fatalf("first set: %v", r.Headers)
	}
	_, cas1, ok := h.SharedData("k")
	if !ok {
		t.Fatal("k not stored")
	}
	// The second request runs on the other VM: shared data spans VMs.
	r, _ = run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "v2")
	if mustGet(t, r, "x-shared-old") != "v1" || mustGet(t, r, "x-shared-cas") != strconv.Itoa(int(cas1)) || mustGet(t, r, "x-shared-result") != "ok" {
		t.Fatalf("second set: %v", r.Headers)
	}
	// A stale token loses.
	r, _ = run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "v3", "x-cas", strconv.Itoa(int(cas1)))
	if got := mustGet(t, r, "x-shared-result"); got != "proxywasm: CAS mismatch" {
		t.Fatalf("stale cas result = %q", got)
	}
	if v, _, _ := h.SharedData("k"); string(v) != "v2" {
		t.Fatalf("k = %q, want v2", v)
	}
}

func TestHost_MetricsAggregateAcrossVMs(t *testing.T) {
	h := newHost(t, Options{Workers: 3})
	for i := 0; i < 9; i++ {
		if _, err := run(t, h, "x-mode", "echo"); err != nil {
			t.Fatal(err)
		}
	}
	wantMetrics := map[string]int64{"test_requests": 9, "test_gauge": 42, "test_hist": 9, "test_logs": 9, "test_deletes": 9}
	for name, want := range wantMetrics {
		if got, ok := h.Metric(name); !ok || got != want {
			t.Errorf("%s = %d (%v), want %d", name, got, ok, want)
		}
	}
	if s := h.Histogram("test_hist"); len(s) != 9 || s[0] != 7 {
		t.Errorf("histogram = %v", s)
	}
	if _, ok := h.Metric("nope"); ok {
		t.Error("unknown metric reported")
	}
	// Three VMs define each name; it is listed once.
	names := h.MetricNames()
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
		t.Errorf("MetricNames %v: want sorted, each once", names)
	}
	for name := range wantMetrics {
		if !slices.Contains(names, name) {
			t.Errorf("MetricNames %v lacks %s", names, name)
		}
	}
}

func TestHost_Tick(t *testing.T) {
	h := newHost(t, Options{Workers: 2, PluginConfig: []byte("tick=5")})
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, _ := h.Metric("test_ticks")
		if n >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ticks = %d after 5s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Reconfiguring without a tick stops the timers.
	if err := h.Configure(context.Background(), []byte("quiet")); err != nil {
		t.Fatal(err)
	}
	n1, _ := h.Metric("test_ticks")
	time.Sleep(50 * time.Millisecond)
	if n2, _ := h.Metric("test_ticks"); n2 != n1 {
		t.Fatalf("ticks went on after SetTickPeriod(0): %d → %d", n1, n2)
	}
}

func TestHost_Logs(t *testing.T) {
	var mu sync.Mutex
	var cb []LogEntry
	h := newHost(t, Options{OnLog: func(e LogEntry) { mu.Lock(); cb = append(cb, e); mu.Unlock() }, LogLevel: LogLevelDebug})
	if _, err := run(t, h, "x-mode", "log", "x-log-level", "3", "x-log", "hello warn"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, h, "x-mode", "log", "x-log-level", "0", "x-log", "dropped trace"); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range h.Logs() {
		if e.Message == "dropped trace" {
			t.Error("trace entry below LogLevel recorded")
		}
		if e.Message == "hello warn" && e.Level == LogLevelWarn {
			found = true
		}
	}
	if !found {
		t.Fatalf("warn entry missing from %v", h.Logs())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cb) != len(h.Logs()) {
		t.Errorf("callback saw %d entries, Logs %d", len(cb), len(h.Logs()))
	}
}

func TestHost_ConfigureRefusalKeepsPrevious(t *testing.T) {
	h := newHost(t, Options{Workers: 3, PluginConfig: []byte("A")})
	if err := h.Configure(context.Background(), []byte("B")); err != nil {
		t.Fatal(err)
	}
	err := h.Configure(context.Background(), []byte("refuse"))
	if !errors.Is(err, ErrConfigRefused) || !strings.HasSuffix(err.Error(), "refused the configuration (it logged: refusing configuration)") {
		t.Fatalf("err = %v, want ErrConfigRefused with what the plugin logged", err)
	}
	for i := 0; i < 6; i++ { // every VM twice
		r, err := run(t, h, "x-mode", "echo")
		if err != nil {
			t.Fatal(err)
		}
		if got := mustGet(t, r, "x-config"); got != "B" {
			t.Fatalf("request %d: config %q, want B", i, got)
		}
	}
	if _, err := New(context.Background(), guestWasm, Options{PluginConfig: []byte("refuse")}); !errors.Is(err, ErrConfigRefused) {
		t.Fatalf("New with a refused config: %v", err)
	}
}

// TestHost_FailurePolicy: a VM that traps is failed, and what its later
// requests get is the failure policy's answer (Envoy's CHECK_FAIL_HTTP in
// cpp-host src/context.cc and Context::failStream).
func TestHost_FailurePolicy(t *testing.T) {
	for _, policy := range []FailurePolicy{FailClosed, FailOpen, FailReload} {
		t.Run(policy.String(), func(t *testing.T) {
			h := newHost(t, Options{Workers: 1, PluginConfig: []byte("live"), FailurePolicy: policy, ReloadBackoff: time.Nanosecond})
			check := func(what string, r Result, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				switch policy {
				case FailOpen:
					if r.Local != nil || mustGet(t, r, "x-mode") == "" {
						t.Fatalf("%s: %+v, want the request to pass", what, r)
					}
				default:
					if l := r.Local; l == nil || l.Status != 503 || len(l.Body) != 0 || l.Details != "wasm_fail_stream" {
						t.Fatalf("%s: %+v, want Envoy's 503", what, r)
					}
				}
			}
			r, err := run(t, h, "x-mode", "trap")
			check("the trapping request", r, err)
			if got := h.Failures(); got != 1 {
				t.Fatalf("Failures = %d, want 1", got)
			}
			r, err = run(t, h, "x-mode", "echo")
			if policy == FailReload {
				if err != nil || r.Local != nil || mustGet(t, r, "x-config") != "live" {
					t.Fatalf("after a reload: %+v %v", r, err)
				}
				return
			}
			check("a later request", r, err)
			// A trap while the response is handled.
			h2 := newHost(t, Options{Workers: 1, FailurePolicy: policy})
			s := h2.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", Headers: [][2]string{{"x-mode", "trap-response"}}})
			defer s.Close()
			if _, err := s.RequestHeaders(context.Background()); err != nil {
				t.Fatal(err)
			}
			r, err = s.ResponseHeaders(context.Background(), 200, [][2]string{{"x-mode", "upstream"}})
			check("a trap in the response", r, err)
		})
	}
}

// A failed VM answers the requests paused on it (for a call-out) by the
// failure policy rather than leaving them waiting for a callback that
// cannot come.
func TestHost_FailureAnswersPausedStreams(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	}))
	defer srv.Close()
	defer close(release)
	h := newHost(t, Options{Workers: 1, Clusters: map[string]string{"backend": srv.URL}})
	s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/",
		Headers: [][2]string{{"x-mode", "callout"}, {"x-timeout", "5000"}}})
	defer s.Close()
	type out struct {
		r   Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := s.RequestHeaders(context.Background())
		done <- out{r, err}
	}()
	// The call-out is out, so the stream has paused (the trapping request
	// below waits for the VM, which its callback holds until it returns).
	<-arrived
	if r, err := run(t, h, "x-mode", "trap"); err != nil || r.Local == nil || r.Local.Status != 503 {
		t.Fatalf("trap: %+v %v", r, err)
	}
	o := <-done
	if o.err != nil || o.r.Local == nil || o.r.Local.Status != 503 {
		t.Fatalf("paused stream: %+v %v", o.r, o.err)
	}
}

// An unrecovered guest panic is a trap; the binding recovers panics, so a
// panic in a callback leaves the VM serving, with the panic logged.
func TestHost_RecoveredPanicKeepsVM(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	if r, err := run(t, h, "x-mode", "panic"); err != nil || r.Local != nil {
		t.Fatalf("panic: %+v %v", r, err)
	}
	if n := h.Failures(); n != 0 {
		t.Fatalf("Failures = %d, want 0", n)
	}
	if _, err := run(t, h, "x-mode", "echo"); err != nil {
		t.Fatal(err)
	}
	var logged bool
	for _, e := range h.Logs() {
		if e.Level == LogLevelCritical && strings.Contains(e.Message, "panic in proxy_on_request_headers: deliberate panic") && strings.Contains(e.Message, "goroutine") {
			logged = true
		}
	}
	if !logged {
		t.Errorf("no critical log with the panic and its stack: %v", h.Logs())
	}
}

func TestHost_Middleware(t *testing.T) {
	var failOpen bool
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Mode") == "trap" && !failOpen {
			t.Error("trapped request reached next with fail_closed")
		}
		w.Header().Set("X-Secret", "s")
		w.Header().Set("X-Config-Seen", r.Header.Get("X-Config"))
		w.Header().Set("X-Source-Seen", r.Header.Get("X-Prop-Source.address"))
		w.Header()["X-Multi"] = []string{"a", "b"}
		w.Header().Set("X-Guest-Saw-Status", "upstream") // the echo guest adds a second value
		w.WriteHeader(200)
		io.WriteString(w, "upstream body")
	})
	for _, failOpen = range []bool{false, true} {
		policy := map[bool]FailurePolicy{false: FailClosed, true: FailOpen}[failOpen]
		h := newHost(t, Options{Workers: 1, PluginConfig: []byte("mw"), FailurePolicy: policy})
		srv := httptest.NewServer(h.Middleware(next))
		tests := []struct {
			mode       string
			wantStatus int
			wantBody   string
			check      func(http.Header) error
		}{
			{"echo", 200, "upstream body", func(hd http.Header) error {
				if hd.Get("X-Secret") != "" || hd.Get("X-Config-Seen") != "mw" || hd.Get("X-Replaced") != "new" ||
					!strings.HasPrefix(hd.Get("X-Source-Seen"), "127.0.0.1:") ||
					!slices.Equal(hd.Values("X-Guest-Saw-Status"), []string{"upstream", "200"}) ||
					!slices.Equal(hd.Values("X-Multi"), []string{"a", "b"}) {
					return fmt.Errorf("headers %v", hd)
				}
				return nil
			}},
			{"deny", 429, "denied", func(hd http.Header) error {
				if hd.Get("Retry-After") != "7" {
					return fmt.Errorf("headers %v", hd)
				}
				return nil
			}},
			{"respdeny", 502, "replaced", nil},
			{"trap", map[bool]int{false: 503, true: 200}[failOpen], map[bool]string{false: "", true: "upstream body"}[failOpen], nil},
		}
		for _, tt := range tests {
			req, _ := http.NewRequest("GET", srv.URL+"/mw?q=1", nil)
			req.Header.Set("X-Mode", tt.mode)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tt.wantStatus || string(body) != tt.wantBody {
				t.Errorf("failOpen=%v %s: %d %q, want %d %q", failOpen, tt.mode, res.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if tt.check != nil {
				if err := tt.check(res.Header); err != nil {
					t.Errorf("failOpen=%v %s: %v", failOpen, tt.mode, err)
				}
			}
		}
		srv.Close()
	}
}

// bodyLogs are the test guest's logs of its body mode (modeBody), in order.
func bodyLogs(h *Host) []string {
	var msgs []string
	for _, e := range h.Logs() {
		msgs = append(msgs, e.Message)
	}
	return hosttest.BodyLogs(msgs)
}

// The plugin reads a response body as Envoy gives it: each part in its
// body callback, as the buffer HttpResponseBody, the last with the end of
// the stream; a part larger than the guest's arena in parts of 16 KiB.
// Through Middleware each write of the upstream is a part, one behind, so
// that the last goes with the stream's end; a response without a body
// ends the stream at its headers.
func TestStream_ResponseBody(t *testing.T) {
	for _, b := range hosttest.Bodies {
		h := newHost(t, Options{Workers: 1})
		s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", Host: "h", Headers: [][2]string{{"x-mode", "body"}}})
		if _, err := s.RequestHeaders(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ResponseHeaders(context.Background(), 200, nil); err != nil {
			t.Fatal(err)
		}
		for i, part := range b.Parts {
			if err := s.ResponseBody([]byte(part), i == len(b.Parts)-1); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		if got := bodyLogs(h); !slices.Equal(got, b.Logs) {
			t.Errorf("the guest saw\n%q\nwant\n%q", got, b.Logs)
		}
	}

	for _, tc := range []struct {
		name   string
		writes []string
		header bool // WriteHeader before any write
		want   []string
	}{
		{"one write", []string{"hello"}, false, []string{"headers end_of_stream=false", "body 5 end_of_stream=true parts=5 hello"}},
		{"writes", []string{"a", "bc", "def"}, true, []string{"headers end_of_stream=false", "body 1 end_of_stream=false parts=1 a",
			"body 2 end_of_stream=false parts=2 bc", "body 3 end_of_stream=true parts=3 def"}},
		{"no body", nil, false, []string{"headers end_of_stream=true"}},
		{"headers, then no body", nil, true, []string{"headers end_of_stream=false", "body 0 end_of_stream=true parts= "}},
	} {
		h := newHost(t, Options{Workers: 1})
		srv := httptest.NewServer(h.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tc.header {
				w.WriteHeader(201)
			}
			for _, b := range tc.writes {
				io.WriteString(w, b)
			}
		})))
		req, _ := http.NewRequest("GET", srv.URL+"/", nil)
		req.Header.Set("X-Mode", "body")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		srv.Close()
		if string(body) != strings.Join(tc.writes, "") {
			t.Errorf("%s: the client got %q", tc.name, body)
		}
		if got := bodyLogs(h); !slices.Equal(got, tc.want) {
			t.Errorf("%s: the guest saw\n%q\nwant\n%q", tc.name, got, tc.want)
		}
	}
}

func TestHost_Hammer(t *testing.T) {
	srv := hosttest.Backend(t)
	h := newHost(t, Options{Workers: 4, Clusters: map[string]string{"backend": srv.URL}})
	const goroutines, each = 32, 25
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				path := fmt.Sprintf("/c/%d/%d", g, i)
				mode := []string{"callout", "echo", "shared", "deny"}[i%4]
				r, err := run(t, h, "x-mode", mode, "x-callout-path", path, "x-key", "hammer", "x-value", path)
				if err != nil {
					errs <- err
					return
				}
				switch mode {
				case "callout":
					if v, _ := r.Get("x-callout-body"); v != path {
						errs <- fmt.Errorf("call-out answer %q delivered to the stream of %q", v, path)
						return
					}
				case "deny":
					if r.Local == nil || r.Local.Status != 429 {
						errs <- fmt.Errorf("deny: %+v", r)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n, _ := h.Metric("test_deletes"); n != goroutines*each {
		t.Errorf("test_deletes = %d, want %d (every context deleted)", n, goroutines*each)
	}
	for _, v := range h.vms {
		v.mu.Lock()
		if n := len(v.inst.streams); n != 0 {
			t.Errorf("vm %d keeps %d streams", v.idx, n)
		}
		v.mu.Unlock()
	}
}

// TestHost_MiddlewareHammer: Middleware recycles its streams, so requests
// at once and one after another through it must each see only their own
// headers, answers and call-outs, and no stream may stay behind in a VM.
func TestHost_MiddlewareHammer(t *testing.T) {
	srv := hosttest.Backend(t)
	h := newHost(t, Options{Workers: 2, Clusters: map[string]string{"backend": srv.URL}})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Secret", "s")
		w.Header().Set("X-Path-Seen", r.Header.Get("X-Prop-Request.path"))
		w.Header().Set("X-Callout-Seen", r.Header.Get("X-Callout-Body"))
		w.Header().Set("X-Value-Seen", r.Header.Get("X-Value"))
		io.WriteString(w, "upstream body")
	})
	mw := h.Middleware(next)
	const goroutines, each = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				path := fmt.Sprintf("/h/%d/%d", g, i)
				mode := []string{"callout", "echo", "", "deny"}[(g+i)%4]
				req := httptest.NewRequest("GET", path, nil)
				if mode != "" {
					req.Header.Set("X-Mode", mode)
				}
				req.Header.Set("X-Callout-Path", path)
				req.Header.Set("X-Value", path)
				rec := httptest.NewRecorder()
				mw.ServeHTTP(rec, req)
				hd := rec.Result().Header
				var err error
				switch mode {
				case "deny":
					if rec.Code != 429 || rec.Body.String() != "denied" || hd.Get("X-Path-Seen") != "" {
						err = fmt.Errorf("%s deny: %d %q %v", path, rec.Code, rec.Body, hd)
					}
				case "echo":
					if rec.Code != 200 || hd.Get("X-Path-Seen") != path || hd.Get("X-Guest-Saw-Status") != "200" || hd.Get("X-Secret") != "" {
						err = fmt.Errorf("%s echo: %d %v", path, rec.Code, hd)
					}
				case "callout":
					if rec.Code != 200 || hd.Get("X-Callout-Seen") != path || hd.Get("X-Value-Seen") != path || hd.Get("X-Guest-Saw-Status") != "" {
						err = fmt.Errorf("%s call-out: %d %v", path, rec.Code, hd)
					}
				default:
					if rec.Code != 200 || hd.Get("X-Value-Seen") != path || hd.Get("X-Secret") != "s" || hd.Get("X-Path-Seen") != "" {
						err = fmt.Errorf("%s untouched: %d %v", path, rec.Code, hd)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, v := range h.vms {
		v.mu.Lock()
		if n := len(v.inst.streams); n != 0 {
			t.Errorf("vm %d keeps %d streams", v.idx, n)
		}
		v.mu.Unlock()
	}
}

// TestGuest_HotPathDoesNotAllocate counts guest heap allocations over many
// requests that use the binding's non-allocating calls.
func TestGuest_HotPathDoesNotAllocate(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	mallocs := func() uint64 {
		r, err := run(t, h, "x-mode", "mallocs")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseUint(mustGet(t, r, "x-mallocs"), 10, 64)
		return n
	}
	hot := func(n int) {
		for i := 0; i < n; i++ {
			s := h.NewStream(context.Background(), RequestInfo{Method: "GET", Path: "/", SourceAddress: "10.0.0.1:1",
				Headers: [][2]string{{"x-mode", "hot"}, {"x-user", "alice"}}})
			if _, err := s.RequestHeaders(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ResponseHeaders(context.Background(), 200, nil); err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
	}
	hot(100) // warm up pools, maps and the arena
	base0 := mallocs()
	base1 := mallocs()
	probe := base1 - base0 // allocations of one probe request
	hot(1000)
	after := mallocs()
	perReq := float64(after-base1-probe) / 1000
	t.Logf("guest mallocs per hot request: %.3f (probe %d)", perReq, probe)
	if perReq > 0.01 {
		t.Fatalf("guest allocates %.3f times per hot request, want 0", perReq)
	}
}

// The plugin sees the request target as it came, as Envoy passes it on,
// not the URL re-escaped; and when the plugin leaves :path alone, the
// request goes on with the target it came with.
func TestHost_MiddlewareRawPath(t *testing.T) {
	const target = "/caf\xc3\xa9/%7e?q=a%20b"
	var saw, uri string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw, uri = r.Header.Get("X-Prop-Request.path"), r.RequestURI
	})
	h := newHost(t, Options{Workers: 1, PluginConfig: []byte("raw")})
	srv := httptest.NewServer(h.Middleware(next))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET "+target+" HTTP/1.1\r\nHost: x\r\nX-Mode: echo\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || saw != target || uri != target {
		t.Errorf("status %d; the plugin saw :path %q, next got %q; want %q", res.StatusCode, saw, uri, target)
	}
}

// Request ids the host makes are 32 lower-case hex digits and never
// repeat, from any number of goroutines.
func TestNewRequestID(t *testing.T) {
	const goroutines, each = 8, 2000
	ids := make(chan string, goroutines*each)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ids <- NewRequestID()
			}
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" || seen[id] {
			t.Fatalf("id %q (seen before: %v)", id, seen[id])
		}
		seen[id] = true
	}
}

// A gRPC request's local answer is gRPC's, as Envoy sends it: 200 with no
// body, grpc-status mapped from the HTTP status (or the plugin's own),
// grpc-message the body percent-encoded, the plugin's headers kept; over
// HTTP/2, as gRPC clients speak. application/grpc-web is not gRPC.
func TestHost_MiddlewareGRPC(t *testing.T) {
	h := newHost(t, Options{Workers: 1, PluginConfig: []byte("mw"), FailurePolicy: FailClosed})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &h2c, Handler: h.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream body")
	}))}
	go srv.Serve(ln)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{Protocols: &h2c}}
	defer client.CloseIdleConnections()
	for _, tc := range []struct {
		mode, contentType, method string
		want                      string // status, content type, grpc-status, grpc-message, retry-after, body
	}{
		{"deny", "application/grpc", "POST", "200|application/grpc|14|denied|7|"},
		{"deny", "application/grpc+proto", "POST", "200|application/grpc|14|denied|7|"},
		{"deny", "application/grpc", "HEAD", "200|application/grpc|14||7|"},
		{"respdeny", "application/grpc", "POST", "200|application/grpc|14|replaced||"},
		{"deny", "application/grpc-web", "POST", "429|text/plain|||7|denied"},
		{"echo", "application/grpc", "POST", "200|text/plain; charset=utf-8||||upstream body"},
		{"trap", "application/grpc", "POST", "200|application/grpc|14|||"}, // last: the VM stays failed
	} {
		req, _ := http.NewRequest(tc.method, "http://"+ln.Addr().String()+"/pkg.Svc/Call", strings.NewReader("msg"))
		req.Header.Set("Content-Type", tc.contentType)
		req.Header.Set("X-Mode", tc.mode)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		got := strings.Join([]string{strconv.Itoa(res.StatusCode), res.Header.Get("Content-Type"), res.Header.Get("Grpc-Status"),
			res.Header.Get("Grpc-Message"), res.Header.Get("Retry-After"), string(body)}, "|")
		if got != tc.want {
			t.Errorf("%s %s %s: got %q, want %q", tc.mode, tc.method, tc.contentType, got, tc.want)
		}
	}
}

func TestWriteLocal_GRPC(t *testing.T) {
	for _, tc := range []struct {
		status     int
		grpcStatus int32
		body       string
		want       string // grpc-status, grpc-message
	}{
		{429, -1, "", "14|"},
		{429, 8, "quota", "8|quota"}, // the plugin's own status wins
		{429, 17, "", "14|"},         // beyond the known codes: none given
		{400, -1, "", "13|"}, {401, -1, "", "16|"}, {403, -1, "", "7|"}, {404, -1, "", "12|"},
		{502, -1, "", "14|"}, {503, -1, "", "14|"}, {504, -1, "", "14|"}, {418, -1, "", "2|"},
		{429, -1, "50% off ~ \"ok\"\n\xc3\xa9", `14|50%25 off %7E "ok"%0A%C3%A9`},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/pkg.Svc/Call", nil)
		req.Header.Set("Content-Type", "application/grpc")
		WriteLocalResponse(rec, req, &LocalResponse{Status: tc.status, GrpcStatus: tc.grpcStatus, Body: []byte(tc.body),
			Headers: [][2]string{{"content-length", "5"}}})
		got := rec.Header().Get("Grpc-Status") + "|" + rec.Header().Get("Grpc-Message")
		if got != tc.want || rec.Code != 200 || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") != "" {
			t.Errorf("%d, plugin's %d, %q: %d %q body %q content-length %q; want 200 %q, no body", tc.status, tc.grpcStatus, tc.body,
				rec.Code, got, rec.Body, rec.Header().Get("Content-Length"), tc.want)
		}
	}
}
