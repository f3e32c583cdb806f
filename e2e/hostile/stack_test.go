package hostile

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/wasmhost"
)

// builtPlugin is the plugin as `make wasm` builds it (once per test
// process, and so once per fuzz worker).
func builtPlugin(t testing.TB) []byte { return e2etest.Plugin(t) }

const (
	jwtSecret = "hostile-test-secret-0123456789abcdef"
	// perClient is the limit of the one rule: per user (anonymous: per
	// client IP) and endpoint, so each case below has counters of its own.
	perClient = 3
)

// config: fail_closed in most tests, so that a check the bridge refuses shows as a 503
// instead of passing unnoticed. The call-out timeout is long: these tests
// count decisions, and a loaded machine must not turn them into failures.
// The rule is a token bucket refilling its limit in an hour, not a window
// aligned to the clock's hours: in a test running across the turn of an
// hour, a client's count started again (a flood failed that way at 01:00).
func config(maxEntries int, mode string, limit int) string {
	return `{
  "failure_mode": "` + mode + `",
  "bridge": {"cluster": "sluice_bridge", "timeout": "5s"},
  "identity": {
    "sources": [
      {"type": "jwt", "keys": [
        {"alg": "HS256", "secret": "` + jwtSecret + `"},
        {"alg": "RS256", "pem": ` + jsonString(rsaPublicPEM) + `}
      ]},
      {"type": "header", "header": "x-user-id"}
    ],
    "client_ip": {"trusted_proxy_depth": 1}
  },
  "rules": [{"name": "per-client", "scope": "user+endpoint", "algorithm": "token_bucket", "limit": ` + fmt.Sprint(limit) + `, "window": "1h"}],
  "local_cache": {"max_entries": ` + fmt.Sprint(maxEntries) + `}
}`
}

func jsonString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// stack is a bridge (memory store), the plugin host and a gateway, with
// the outcomes the clients saw.
type stack struct {
	host    *wasmhost.Host
	bridge  *redisbridge.Server
	gateway *httptest.Server
	// Outcomes of every request sent through the plugin, by the tests'
	// own count: allowed (passed to the upstream) and denied (429).
	allowed, denied atomic.Int64
}

func newStack(t testing.TB, maxEntries int) *stack {
	return newStackWith(t, config(maxEntries, "fail_closed", perClient))
}

func newStackWith(t testing.TB, cfg string) *stack {
	t.Helper()
	set := redisbridge.DefaultSettings()
	set.Listen = "127.0.0.1:0"
	set.Logger = slog.New(slog.DiscardHandler)
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		br.Shutdown(ctx)
		br.Close()
	})
	s := &stack{bridge: br}
	s.host, err = wasmhost.New(context.Background(), builtPlugin(t), wasmhost.Options{
		Workers: 2, CompilationCache: e2etest.CompilationCache(t), PluginConfig: []byte(cfg), RootID: "sluice",
		Clusters: map[string]string{"sluice_bridge": "http://" + ln.Addr().String()},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.host.Close() })
	s.gateway = httptest.NewServer(s.host.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream")
	})))
	t.Cleanup(s.gateway.Close)
	return s
}

// rawRequest writes an HTTP/1.1 request head byte for byte, so that it
// can carry what net/http's client refuses to send.
func rawRequest(method, target string, headers ...[2]string) string {
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: gateway.test\r\n")
	for _, h := range headers {
		b.WriteString(h[0] + ": " + h[1] + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n")
	return b.String()
}

// send writes a raw request to the gateway and returns the status, after
// counting the outcome.
func (s *stack) send(t *testing.T, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", s.gateway.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	switch res.StatusCode {
	case 200:
		if string(body) != "upstream" {
			t.Fatalf("200 without the upstream's body: %q", body)
		}
		s.allowed.Add(1)
	case 429:
		s.denied.Add(1)
	}
	return res.StatusCode
}

// stream runs a request through the plugin without an HTTP layer (bytes
// no HTTP/1.1 server accepts, and the fuzz target), and returns the
// status the client would see: 200 when it passes, else the local answer.
func (s *stack) stream(t testing.TB, info wasmhost.RequestInfo) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if info.SourceAddress == "" {
		info.SourceAddress = "127.0.0.1:40000"
	}
	info.EndOfStream = true
	st := s.host.NewStream(ctx, info)
	defer st.Close()
	res, err := st.RequestHeaders(ctx)
	if err != nil {
		t.Fatalf("request headers: %v", err)
	}
	if res.Local != nil {
		if res.Local.Status == 429 {
			s.denied.Add(1)
		}
		return res.Local.Status
	}
	if _, err := st.ResponseHeaders(ctx, 200, nil); err != nil {
		t.Fatalf("response headers: %v", err)
	}
	s.allowed.Add(1)
	return 200
}

// checkAccounts asserts that no VM trapped, that the bridge decided every
// request (no failure mode applied), and that the plugin's counters agree
// with what the clients saw.
func (s *stack) checkAccounts(t testing.TB) {
	t.Helper()
	if n := s.host.Failures(); n != 0 {
		t.Errorf("plugin VMs trapped %d times", n)
	}
	m := func(name string) int64 { v, _ := s.host.Metric(name); return v }
	req, al, de, ex := m("sluice_requests_total"), m("sluice_allowed_total"), m("sluice_denied_total"), m("sluice_exempt_total")
	fo, fc, be := m("sluice_fail_open_total"), m("sluice_fail_closed_total"), m("sluice_bridge_errors_total")
	if be != 0 || fo != 0 || fc != 0 {
		t.Errorf("bridge errors %d, fail_open %d, fail_closed %d: every hostile request should get a decision", be, fo, fc)
	}
	if req != al+de+ex+fo+fc {
		t.Errorf("requests %d != allowed %d + denied %d + exempt %d + failed %d", req, al, de, ex, fo+fc)
	}
	if al != s.allowed.Load() || de != s.denied.Load() {
		t.Errorf("plugin counted %d allowed, %d denied; clients saw %d, %d", al, de, s.allowed.Load(), s.denied.Load())
	}
}

func validJWT(sub string) string {
	return jwttest.Sign(`{"alg":"HS256","typ":"JWT"}`, fmt.Sprintf(`{"sub":%q,"exp":%d}`, sub, time.Now().Add(time.Hour).Unix()), jwtSecret)
}

// rsaPublicPEM is a 2048-bit RSA public key the config trusts for RS256;
// no token in these tests is signed with its private key. It is the
// "public key" of the alg confusion attack.
var rsaPublicPEM = func() string {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err) // test setup: the machine has no randomness
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		panic(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}()
