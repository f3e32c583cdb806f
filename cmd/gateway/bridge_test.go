package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// With --embed-bridge the plugin's checks are decided in the gateway's
// process, with the bridge's SLUICE_* settings: allowed, then refused with
// the bridge's decision, as with a bridge of its own; the bridge's API is
// on the admin address.
func TestRun_EmbeddedBridge(t *testing.T) {
	dir := t.TempDir()
	plugin, config, upstream := limitFiles(t, dir, 2)
	t.Setenv("SLUICE_AUDIT_LOG", filepath.Join(dir, "audit.log"))
	t.Setenv("SLUICE_CHECK_TOKEN", "t0ken") // the bridge's own settings apply: the plugin sends none
	addrs := nettest.FreeAddrs(t, 2)
	listen, admin := addrs[0], addrs[1]
	args := []string{"--listen", listen, "--admin-listen", admin, "--plugin", plugin, "--config", config,
		"--upstream", upstream, "--embed-bridge", "sluice_bridge", "--log-level", "error"}
	if err := run(t.Context(), append(args, "--validate"), os.Stderr); err != nil {
		t.Fatalf("--validate: %v", err)
	}
	stop := startRun(t, admin, args...)
	// Without the token the bridge refuses the checks: the plugin's
	// failure mode (closed here: 503) shows the bridge's settings apply.
	if code, _, err := get("http://"+listen+"/api/items", "X-User-Id", "alice"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("with the bridge wanting a token the plugin lacks: %d %v", code, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}

	t.Setenv("SLUICE_CHECK_TOKEN", "")
	stop = startRun(t, admin, args...)
	checkTwoAllowed(t, listen)
	code, body, err := get("http://" + admin + "/metrics")
	if err != nil || code != 200 || !strings.Contains(body, "\nsluice_bridge_checks_total{result=\"allowed\"} 2\n") ||
		!strings.Contains(body, "\nsluice_bridge_checks_total{result=\"denied\"} 1\n") {
		t.Errorf("the bridge's /metrics on the admin address: %d %v\n%s", code, err, body)
	}
	if code, body, err := get("http://" + admin + "/readyz"); err != nil || code != 200 || body != `{"status":"ready","store":"memory"}`+"\n" {
		t.Errorf("/readyz: %d %q %v", code, body, err)
	}
	if code, body, err := get("http://" + admin + "/ready"); err != nil || code != 200 || body != "LIVE\n" {
		t.Errorf("the gateway's own /ready: %d %q %v", code, body, err)
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

// limitConfig is a plugin configuration that allows each X-User-Id limit
// requests under /api/, and refuses them when the bridge cannot decide.
func limitConfig(limit int) string {
	return fmt.Sprintf(`{"bridge": {"cluster": "sluice_bridge", "timeout": "1s"}, "failure_mode": "fail_closed",
	  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": %d, "window": "1h", "algorithm": "fixed_window"}]}`, limit)
}

// limitFiles writes the plugin and limitConfig(limit) into dir, and serves
// an upstream until t ends.
func limitFiles(t *testing.T, dir string, limit int) (plugin, config, upstream string) {
	t.Helper()
	plugin, config = filepath.Join(dir, "plugin.wasm"), filepath.Join(dir, "config.json")
	if err := os.WriteFile(plugin, e2etest.Plugin(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(limitConfig(limit)), 0o600); err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") }))
	t.Cleanup(up.Close)
	return plugin, config, up.URL
}

// checkTwoAllowed sends three requests as alice through the gateway at
// addr, whose plugin has limitConfig(2): the bridge lets two through and
// refuses the third, each answer with what remains.
func checkTwoAllowed(t *testing.T, addr string) {
	t.Helper()
	var got []string
	for range 3 {
		req, _ := http.NewRequest("GET", "http://"+addr+"/api/items", nil)
		req.Header.Set("X-User-Id", "alice")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		got = append(got, res.Status+" remaining "+res.Header.Get("X-RateLimit-Remaining"))
	}
	if want := []string{"200 OK remaining 1", "200 OK remaining 0", "429 Too Many Requests remaining 0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Gateways whose embedded bridges share one Redis share each quota
// exactly: of requests sent to both at once, no more pass than the limit.
func TestRun_EmbeddedBridgesShareRedis(t *testing.T) {
	dir := t.TempDir()
	const limit, sent = 10, 60
	plugin, config, upstream := limitFiles(t, dir, limit)
	t.Setenv("SLUICE_AUDIT_LOG", filepath.Join(dir, "audit.log"))
	t.Setenv("SLUICE_STORE", "redis")
	t.Setenv("SLUICE_REDIS_URL", redistest.Start(t).URL)
	var gateways []string
	for range 2 {
		addrs := nettest.FreeAddrs(t, 2)
		listen, admin := addrs[0], addrs[1]
		stop := startRun(t, admin, "--listen", listen, "--admin-listen", admin, "--plugin", plugin, "--config", config,
			"--upstream", upstream, "--embed-bridge", "sluice_bridge", "--log-level", "error")
		defer stop()
		gateways = append(gateways, listen)
	}
	codes := make(chan int, sent)
	var wg sync.WaitGroup
	for i := range sent {
		wg.Go(func() {
			code, _, err := get("http://"+gateways[i%2]+"/api/items", "X-User-Id", "alice")
			if err != nil {
				t.Error(err)
			}
			codes <- code
		})
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if want := map[int]int{200: limit, 429: sent - limit}; !reflect.DeepEqual(got, want) {
		t.Errorf("answers by status %v, want %v", got, want)
	}
}

// The bridge's settings are checked at start, and the error names them;
// those of a listener the embedded bridge does not have are refused.
func TestRun_EmbeddedBridgeSettings(t *testing.T) {
	plugin, config := guestFiles(t, t.TempDir())
	for _, tt := range []struct{ env, value, err string }{
		{"SLUICE_STORE", "disk", `--embed-bridge: --store: "disk" is neither memory nor redis`},
		{"SLUICE_REDIS_BATCH", "many", `--embed-bridge: SLUICE_REDIS_BATCH: parse error`},
		{"SLUICE_LISTEN", ":8081", "--embed-bridge: SLUICE_LISTEN does not apply to an embedded bridge"},
		{"SLUICE_TLS_CERT", "cert.pem", "--embed-bridge: SLUICE_TLS_CERT does not apply to an embedded bridge"},
		{"SLUICE_TLS_CLIENT_CA", "ca.pem", "--embed-bridge: SLUICE_TLS_CLIENT_CA does not apply to an embedded bridge"},
		{"SLUICE_RLS_CONFIG", "ratelimit.yaml", "--embed-bridge: SLUICE_RLS_CONFIG does not apply to an embedded bridge"},
		{"SLUICE_RLS_SHADOW_MODE", "true", "--embed-bridge: SLUICE_RLS_SHADOW_MODE does not apply to an embedded bridge"},
		{"SLUICE_MAX_CONNECTION_AGE", "1h", "--embed-bridge: SLUICE_MAX_CONNECTION_AGE does not apply to an embedded bridge"},
		{"SLUICE_RLS_QUOTA_MODE", "true", "--embed-bridge: SLUICE_RLS_QUOTA_MODE does not apply to an embedded bridge"},
		{"SLUICE_RLS_OVER_LIMIT_CACHE", "1000", "--embed-bridge: SLUICE_RLS_OVER_LIMIT_CACHE does not apply to an embedded bridge"},
		{"SLUICE_RLS_RESPONSE_METADATA", "true", "--embed-bridge: SLUICE_RLS_RESPONSE_METADATA does not apply to an embedded bridge"},
		{"SLUICE_RLS_RESPONSE_HEADER_NAMES", "a,b,c", "--embed-bridge: SLUICE_RLS_RESPONSE_HEADER_NAMES does not apply to an embedded bridge"},
		{"SLUICE_RLS_RESPONSE_HEADERS", "true", "--embed-bridge: SLUICE_RLS_RESPONSE_HEADERS does not apply to an embedded bridge"},
		{"SLUICE_VALIDATE", "true", "--embed-bridge: SLUICE_VALIDATE does not apply to an embedded bridge"},
		{"SLUICE_ENVOY_RATELIMIT_ENV", "true", "--embed-bridge: SLUICE_ENVOY_RATELIMIT_ENV does not apply to an embedded bridge"},
		{"SLUICE_RLS_XDS", "http://xds:18001", "--embed-bridge: SLUICE_RLS_XDS does not apply to an embedded bridge"},
		{"SLUICE_RLS_MERGE_DOMAIN_CONFIG", "true", "--embed-bridge: SLUICE_RLS_MERGE_DOMAIN_CONFIG does not apply to an embedded bridge"},
	} {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv(tt.env, tt.value)
			err := run(t.Context(), []string{"--validate", "--plugin", plugin, "--config", config, "--embed-bridge", "b", "--log-level", "error"}, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("err = %v, want %q", err, tt.err)
			}
		})
	}
}

// Through the gateway with --tls-client-ca, the plugin's peer_certificate
// source identifies each calling service by its certificate's SPIFFE id:
// each gets its own quota whatever X-User-Id it sends, and a client
// without a URI in its certificate falls back to its header, as does one
// without a certificate, which --tls-client-optional lets in.
func TestRun_PeerCertificateIdentity(t *testing.T) {
	dir := t.TempDir()
	plugin, config, upstream := limitFiles(t, dir, 1)
	if err := os.WriteFile(config, []byte(`{"bridge": {"cluster": "sluice_bridge", "timeout": "1s"}, "failure_mode": "fail_closed",
	  "identity": {"sources": [{"type": "peer_certificate"}, {"type": "header", "header": "x-user-id"}]},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 1, "window": "1h", "algorithm": "fixed_window"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_AUDIT_LOG", filepath.Join(dir, "audit.log"))
	ca := tlsfilestest.NewCA(t)
	cert, key := ca.Issue(t, dir, "gateway")
	clientCA := filepath.Join(dir, "clients.pem")
	ca.WriteCert(t, clientCA)
	addrs := nettest.FreeAddrs(t, 2)
	listen, admin := addrs[0], addrs[1]
	stop := startRun(t, admin, "--listen", listen, "--admin-listen", admin, "--plugin", plugin, "--config", config,
		"--upstream", upstream, "--embed-bridge", "sluice_bridge", "--tls-cert", cert, "--tls-key", key,
		"--tls-client-ca", clientCA, "--tls-client-optional", "--log-level", "error")
	defer stop()
	client := func(name string, uris ...string) *http.Client {
		pair, err := tls.LoadX509KeyPair(ca.IssueWith(t, dir, name, func(c *x509.Certificate) {
			c.IPAddresses, c.DNSNames = nil, []string{name + ".shop"}
			for _, u := range uris {
				parsed, _ := url.Parse(u)
				c.URIs = append(c.URIs, parsed)
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{pair}}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	checkout := client("checkout", "spiffe://cluster.local/ns/shop/sa/checkout")
	cart := client("cart", "spiffe://cluster.local/ns/shop/sa/cart")
	noURI := client("legacy")
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	t.Cleanup(noCert.CloseIdleConnections)
	send := func(c *http.Client, user string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+listen+"/api/items", nil)
		req.Header.Set("X-User-Id", user)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	got := []int{
		send(checkout, "alice"), send(checkout, "bob"), // one quota, whatever the header says
		send(cart, "alice"),                        // its own
		send(noURI, "alice"), send(noURI, "carol"), // by the header: alice's and carol's
		send(noCert, "dave"), send(noCert, "dave"), // by the header too
	}
	if want := []int{200, 429, 200, 200, 200, 200, 429}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}
