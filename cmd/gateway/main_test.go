package main

import (
	"bufio"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/wasmhost"
)

func noEnv(string) (string, bool) { return "", false }

// Without --workers the gateway runs one VM per CPU it may use, as Envoy
// one per worker thread, up to the 256 it accepts.
func TestParseFlags_DefaultWorkers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct{ procs, want int }{{1, 1}, {3, 3}, {256, 256}, {300, 256}} {
		runtime.GOMAXPROCS(tc.procs)
		s, err := parseFlags([]string{"--upstream", "http://127.0.0.1:9000"}, noEnv, io.Discard)
		if err != nil || s.workers != tc.want {
			t.Errorf("GOMAXPROCS %d: %d workers (%v), want %d", tc.procs, s.workers, err, tc.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args []string
		err  string
	}{
		{[]string{"--upstream", "http://127.0.0.1:9000", "--cluster", "b=http://127.0.0.1:8081", "--strip-header", "x-user-id"}, ""},
		{[]string{}, "--upstream or --route is required"},
		{[]string{"--route", "/api/**"}, `"/api/**": want [HOST]PATH=URL`},
		{[]string{"--route", "/api/**=ftp://x"}, `"/api/**=ftp://x": "ftp://x" is not an http(s) URL`},
		{[]string{"--route", "api=http://x"}, `"api=http://x": path: path pattern is empty`},
		{[]string{"--route", "/a/**x=http://x"}, `"/a/**x=http://x": path: "**" must be a whole segment`},
		{[]string{"--route", "api.example.com:8080/=http://x"}, `"api.example.com:8080/=http://x": host: host pattern must not carry a port`},
		{[]string{"--route", "a.*.com/=http://x"}, `host: host pattern may use "*" only as a whole first label`},
		{[]string{"--route", "/r/**=http://x timeout=soon"}, `"/r/**=http://x timeout=soon": timeout "soon": want a duration, 0 for none (60s, 1m30s)`},
		{[]string{"--route", "/r/**=http://x timeout=-1s"}, `timeout "-1s": want a duration`},
		{[]string{"--route", "/r/**=http://x retries=2"}, `"/r/**=http://x retries=2": unknown option "retries=2" (a route takes timeout=DURATION, rewrite=PATH and host=HOST)`},
		{[]string{"--route", "/r/**=http://x host=a/b"}, `"/r/**=http://x host=a/b": host "a/b": want a host name`},
		{[]string{"--route", "/r/**=http://x host="}, `host "": want a host name`},
		{[]string{"--route", "/r/*/x=http://x rewrite=/y"}, `"/r/*/x=http://x rewrite=/y": rewrite: the route's path must say which part is replaced`},
		{[]string{"--route", "/r/**=http://x rewrite=y"}, `"/r/**=http://x rewrite=y": rewrite "y": want a path starting with "/"`},
		{[]string{"--route", "/r/**=http://x rewrite=/y?z"}, `rewrite "/y?z": want a path without spaces, control bytes, a query or a fragment`},
		{[]string{"--route", "/r/**=http://x rewrite=/%zz"}, `rewrite "/%zz": invalid URL escape`},
		{[]string{"--validate", "--upstream", "x"}, `--upstream "x" is not an http(s) URL`},
		{[]string{"--upstream", "ftp://x"}, "not an http(s) URL"},
		{[]string{"--upstream", "http://x", "--cluster", "nameonly"}, "NAME=URL"},
		{[]string{"--upstream", "http://x", "--cluster", "b=localhost:1"}, "not an http(s) or unix:// URL"},
		{[]string{"--upstream", "http://x", "--cluster", "b=unix://bridge.sock"}, `"unix://bridge.sock": a Unix socket needs an absolute path`},
		{[]string{"--upstream", "http://x", "--workers", "0"}, "--workers 0"},
		{[]string{"--upstream", "http://x", "--idle-timeout", "0s"}, "--idle-timeout 0s: must be above 0"},
		{[]string{"--upstream", "http://x", "--idle-timeout", "5"}, "invalid value"},
		{[]string{"--upstream", "http://x", "--upstream-timeout", "-1s"}, "--upstream-timeout -1s: must be 0 (none) or above"},
		{[]string{"--upstream", "http://x", "--max-request-headers-kb", "0"}, "--max-request-headers-kb 0: must be from 1 to 8192"},
		{[]string{"--upstream", "http://x", "--max-request-headers-kb", "8193"}, "--max-request-headers-kb 8193: must be from 1 to 8192"},
		{[]string{"--upstream", "http://x", "--strip-header", "bad header"}, "not a header name"},
		{[]string{"--upstream", "http://x", "--env", "A", "--env", "A=1"}, "A is given twice"},
		{[]string{"--upstream", "http://x", "--env", "=1"}, "want NAME or NAME=VALUE"},
		{[]string{"--upstream", "http://x", "stray"}, `unexpected argument "stray"`},
		{[]string{"--upstream", "http://x", "--shutdown-grace", "-1s"}, "--shutdown-grace -1s: must be 0 or above"},
		{[]string{"--upstream", "http://x", "--upstream-protocol", "h2c"}, `--upstream-protocol "h2c": must be http1, http2 or downstream`},
		{[]string{"--upstream", "http://x", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key: give a key for each certificate (1 certificates, 0 keys)"},
		{[]string{"--upstream", "http://x", "--tls-key", "k.pem"}, "--tls-cert and --tls-key: give a key for each certificate (0 certificates, 1 keys)"},
		{[]string{"--upstream", "http://x", "--tls-cert", "a.pem", "--tls-key", "a.key", "--tls-cert", "b.pem"}, "--tls-cert and --tls-key: give a key for each certificate (2 certificates, 1 keys)"},
		{[]string{"--upstream", "http://x", "--tls-client-ca", "ca.pem"}, "--tls-client-ca: only with --tls-cert"},
		{[]string{"--upstream", "http://x", "--tls-cert", "a.pem", "--tls-key", "a.key", "--tls-client-san", "partner.example"}, "--tls-client-san: only with --tls-client-ca"},
		{[]string{"--upstream", "http://x", "--tls-client-san", ""}, "a value is empty"},
		{[]string{"--upstream", "http://x", "--tls-client-optional"}, "--tls-client-optional: only with --tls-client-ca"},
		{[]string{"--upstream", "http://x", "--cluster", "b=http://127.0.0.1:8081", "--embed-bridge", "b"}, "--embed-bridge b: also a --cluster"},
		{[]string{"--upstream", "http://x", "--access-log-json", `{"s":"%RESPONSE_CODE%"}`}, "--access-log-format, --access-log-json: only with --access-log"},
	}
	for _, tc := range tests {
		s, err := parseFlags(tc.args, noEnv, io.Discard)
		if tc.err == "" {
			if err != nil || s.clusters["b"] != "http://127.0.0.1:8081" || len(s.strip) != 1 || s.idleTimeout != defaultIdleTimeout || s.upstreamTimeout != 15*time.Second || s.maxRequestHeadersKB != 60 || s.upstreamProtocol != "http1" {
				t.Errorf("%v: %v %+v", tc.args, err, s)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
		}
	}
}

// Every flag has an environment variable, SLUICE_GATEWAY_ and its name;
// a flag on the command line wins over it; a bad value names the variable.
func TestParseFlags_Environment(t *testing.T) {
	env := map[string]string{
		"SLUICE_GATEWAY_LISTEN": "127.0.0.1:9999", "SLUICE_GATEWAY_PLUGIN": "p.wasm", "SLUICE_GATEWAY_CONFIG": "c.json",
		"SLUICE_GATEWAY_UPSTREAM": "http://127.0.0.1:9000", "SLUICE_GATEWAY_CLUSTER": "a=http://127.0.0.1:1, b=http://127.0.0.1:2, c=unix:///run/sluice/bridge.sock",
		"SLUICE_GATEWAY_WORKERS": "3", "SLUICE_GATEWAY_FAILURE_POLICY": "fail_open", "SLUICE_GATEWAY_STRIP_HEADER": "x-user-id,x-tier",
		"SLUICE_GATEWAY_ENV": "RATE_LIMIT_CHAT_REQUESTS,RATE_LIMIT_CHAT_WINDOW=90", "SLUICE_GATEWAY_APPEND_XFF": "false",
		"SLUICE_GATEWAY_LOG_LEVEL": "debug", "SLUICE_GATEWAY_COMPILE_CACHE": "/tmp/cc", "SLUICE_GATEWAY_IDLE_TIMEOUT": "45s",
		"SLUICE_GATEWAY_ADMIN_LISTEN": "127.0.0.1:9901", "SLUICE_GATEWAY_UPSTREAM_TIMEOUT": "0s",
		"SLUICE_GATEWAY_MAX_REQUEST_HEADERS_KB": "96", "SLUICE_GATEWAY_TLS_CERT": "/etc/gw/cert.pem, /etc/gw/other.pem", "SLUICE_GATEWAY_TLS_KEY": "/etc/gw/key.pem,/etc/gw/other.key",
		"SLUICE_GATEWAY_ACCESS_LOG": "/dev/stdout", "SLUICE_GATEWAY_UPSTREAM_PROTOCOL": "downstream", "SLUICE_GATEWAY_VALIDATE": "true",
		"SLUICE_GATEWAY_SHUTDOWN_GRACE": "35s", "SLUICE_GATEWAY_WATCH": "5s", "SLUICE_GATEWAY_EMBED_BRIDGE": "sluice_bridge",
		"SLUICE_GATEWAY_PRESERVE_EXTERNAL_REQUEST_ID": "true", "SLUICE_GATEWAY_UPSTREAM_TLS_CA": "/etc/gw/ca.pem", "SLUICE_GATEWAY_TLS_CLIENT_CA": "/etc/gw/clients.pem", "SLUICE_GATEWAY_TLS_CLIENT_OPTIONAL": "true",
		"SLUICE_GATEWAY_TLS_CLIENT_SAN": "partner.example, spiffe://example.org/partner", "SLUICE_GATEWAY_ACCESS_LOG_FORMAT": "%RESPONSE_CODE%", "SLUICE_GATEWAY_ACCESS_LOG_JSON": `{"s":"%RESPONSE_CODE%"}`,
		"SLUICE_GATEWAY_ROUTE": "/api/**=http://127.0.0.1:9001, Admin.example.com/**=http://127.0.0.1:9002 timeout=2m",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	s, err := parseFlags(nil, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		listen: "127.0.0.1:9999", plugin: "p.wasm", config: "c.json", upstream: "http://127.0.0.1:9000",
		clusters: clusterFlag{"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2", "c": "unix:///run/sluice/bridge.sock"}, workers: 3, failure: policyFlag{wasmhost.FailOpen},
		strip: listFlag{"x-user-id", "x-tier"}, appendXFF: false, logLevel: "debug", cacheDir: "/tmp/cc", idleTimeout: 45 * time.Second,
		adminListen: "127.0.0.1:9901", maxRequestHeadersKB: 96, tlsCert: valuesFlag{"/etc/gw/cert.pem", "/etc/gw/other.pem"}, tlsKey: valuesFlag{"/etc/gw/key.pem", "/etc/gw/other.key"}, accessLog: "/dev/stdout", upstreamProtocol: "downstream", validate: true, shutdownGrace: 35 * time.Second, watch: 5 * time.Second,
		embedBridge: "sluice_bridge", preserveRequestID: true, upstreamCA: "/etc/gw/ca.pem", clientCA: "/etc/gw/clients.pem", clientOptional: true, clientSANs: valuesFlag{"partner.example", "spiffe://example.org/partner"}, accessLogFormat: "%RESPONSE_CODE%", accessLogJSON: `{"s":"%RESPONSE_CODE%"}`,
		env: envFlag{{name: "RATE_LIMIT_CHAT_REQUESTS", fromHost: true}, {name: "RATE_LIMIT_CHAT_WINDOW", value: "90"}},
	}
	for _, r := range []string{"/api/**=http://127.0.0.1:9001", "Admin.example.com/**=http://127.0.0.1:9002 timeout=2m"} {
		if err := want.routes.Set(r); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("from the environment:\n got %+v\nwant %+v", s, want)
	}
	// Every flag is covered above.
	flagSet(&settings{clusters: clusterFlag{}}).VisitAll(func(f *flag.Flag) {
		if _, ok := env[envName(f.Name)]; !ok {
			t.Errorf("flag --%s: its variable %s is not tested", f.Name, envName(f.Name))
		}
	})

	s, err = parseFlags([]string{"--workers", "5", "--strip-header", "x-a"}, lookup, io.Discard)
	if err != nil || s.workers != 5 || !reflect.DeepEqual(s.strip, listFlag{"x-a"}) {
		t.Errorf("flags must win over the environment: %v %+v", err, s)
	}
	env["SLUICE_GATEWAY_WORKERS"] = "many"
	if _, err := parseFlags(nil, lookup, io.Discard); err == nil || !strings.HasPrefix(err.Error(), "SLUICE_GATEWAY_WORKERS: ") {
		t.Errorf("bad variable: %v", err)
	}
}

// The VM's environment holds the explicit values and those of the named
// variables the gateway has; nothing else of the gateway's environment.
func TestEnvFlag_Environment(t *testing.T) {
	var e envFlag
	for _, v := range []string{"RATE_LIMIT_CHAT_REQUESTS", "RATE_LIMIT_AUTH_WINDOW", "RATE_LIMIT_UPLOAD_REQUESTS=3", "EMPTY="} {
		if err := e.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	host := map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "25", "RATE_LIMIT_UPLOAD_REQUESTS": "99", "SECRET": "x"}
	got := e.environment(func(k string) (string, bool) { v, ok := host[k]; return v, ok })
	want := map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "25", "RATE_LIMIT_UPLOAD_REQUESTS": "3", "EMPTY": ""}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := (envFlag{}).environment(nil); got != nil {
		t.Errorf("no --env: %v, want none", got)
	}
}

// A client's connection is closed once it has been idle for the idle
// timeout, and kept while it is in use.
func TestServer_ClosesIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), settings{idleTimeout: 50 * time.Millisecond})
	go srv.Serve(ln)
	defer srv.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) // the test's own bound, far above the timeout
	br := bufio.NewReader(c)
	for i := range 2 { // the connection is reused: the timeout counts idle time only
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 || resp.Close {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
		resp.Body.Close()
	}
	if n, err := br.ReadByte(); err != io.EOF {
		t.Errorf("idle connection: read %q, %v; want it closed (EOF)", n, err)
	}
}

// The admin address serves the plugin's metrics as Envoy's admin does:
// every metric the plugin defined, at the value the host holds, parsed by
// Prometheus' own parser; and readiness until the gateway drains.
func TestAdminHandler(t *testing.T) {
	host := guestHost(t, 2) // counts requests in its echo mode, sets a gauge, records in a histogram
	gw := host.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 5 {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Mode", "echo")
		gw.ServeHTTP(httptest.NewRecorder(), req)
	}
	var draining atomic.Bool
	admin := adminHandler(host, &draining, nil)

	rec := httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest("GET", "/stats/prometheus", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("/stats/prometheus: %d %v", rec.Code, rec.Header())
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for name, f := range fams {
		m := f.GetMetric()[0]
		got[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	want := map[string]float64{}
	for _, name := range host.MetricNames() {
		v, _ := host.Metric(name)
		want[name] = float64(v) // the guest's names are their Prometheus names
	}
	if want["test_requests"] != 5 || want["test_hist"] != 5 || !reflect.DeepEqual(got, want) {
		t.Errorf("scraped %v\nthe host holds %v", got, want)
	}

	for _, tc := range []struct {
		draining bool
		code     int
		body     string
	}{{false, 200, "LIVE\n"}, {true, 503, "DRAINING\n"}} {
		draining.Store(tc.draining)
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest("GET", "/ready", nil))
		if rec.Code != tc.code || rec.Body.String() != tc.body {
			t.Errorf("/ready, draining %v: %d %q; want %d %q", tc.draining, rec.Code, rec.Body, tc.code, tc.body)
		}
	}
}

// The gateway as started: --admin-listen serves the plugin's metrics and
// readiness beside the gateway, and the gateway stops when told to.
func TestRun_AdminListen(t *testing.T) {
	plugin, config := guestFiles(t, t.TempDir())
	addrs := nettest.FreeAddrs(t, 2)
	listen, admin := addrs[0], addrs[1]
	stop := startRun(t, admin, "--listen", listen, "--admin-listen", admin, "--plugin", plugin, "--config", config,
		"--upstream", "http://127.0.0.1:1", "--log-level", "error")
	// The guest answers this mode itself (a 429), so no upstream is needed.
	if code, _, err := get("http://"+listen+"/", "X-Mode", "deny"); err != nil || code != 429 {
		t.Fatalf("through the gateway: %d %v", code, err)
	}
	code, body, err := get("http://" + admin + "/stats/prometheus")
	if err != nil || code != 200 || !strings.Contains(body, "\n# TYPE test_requests counter\ntest_requests ") {
		t.Errorf("/stats/prometheus: %d %v\n%s", code, err, body)
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

// startRun runs the gateway with args until the returned stop is called,
// which reports what run returned. It waits for the admin address to say
// the gateway is ready (the plugin compiles first).
func startRun(t *testing.T, admin string, args ...string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, os.Stderr) }()
	t.Cleanup(cancel)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body, err := get("http://" + admin + "/ready")
		if err == nil && code == 200 && body == "LIVE\n" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned %v", err)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("/ready: %d %q %v", code, body, err)
		}
	}
	return func() error { cancel(); return <-done }
}

// get sends a GET to url with the headers hdr (name, value, ...) and
// reads the answer.
func get(url string, hdr ...string) (int, string, error) {
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// A request whose head exceeds --max-request-headers-kb is refused with
// 431 before the plugin sees it, as Envoy refuses it.
func TestServer_LimitsRequestHeaders(t *testing.T) {
	var seen atomic.Int32
	addr := serveGateway(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen.Add(1) }))
	for _, tc := range []struct {
		kb   int
		want int
	}{{40, 200}, {70, http.StatusRequestHeaderFieldsTooLarge}} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		req.Header.Set("X-Big", strings.Repeat("a", tc.kb<<10))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("a %d KiB header: %d, want %d", tc.kb, res.StatusCode, tc.want)
		}
	}
	if n := seen.Load(); n != 1 {
		t.Errorf("the handler saw %d requests, want 1", n)
	}
}

// BenchmarkHandler is the gateway's handler in this process, without the
// network and with an upstream that answers at once: what the plugin adds
// to a request no limit matches, in time and in allocations, host and
// guest together; and what the access log adds.
func BenchmarkHandler(b *testing.B) {
	const cfg = `{"bridge": {"cluster": "sluice_bridge", "timeout": "1s"},
	  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 1000000000, "window": "1h", "algorithm": "fixed_window"}]}`
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	host, err := wasmhost.New(context.Background(), e2etest.Plugin(b), wasmhost.Options{Workers: 1, CompilationCache: e2etest.CompilationCache(b), PluginConfig: []byte(cfg),
		RootID: "sluice", Logger: logger, Clusters: map[string]string{"sluice_bridge": "http://127.0.0.1:1"}, LogLevel: wasmhost.LogLevelInfo})
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	// The same plugin with its bridge embedded: a call-out per request
	// answered in process, as --embed-bridge serves it.
	br, err := embeddedBridge(func(string) string { return "" }, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer br.Close()
	embedded, err := wasmhost.New(context.Background(), e2etest.Plugin(b), wasmhost.Options{Workers: 1, CompilationCache: e2etest.CompilationCache(b), PluginConfig: []byte(cfg),
		RootID: "sluice", Logger: logger, Handlers: map[string]http.Handler{"sluice_bridge": br.Handler()}, LogLevel: wasmhost.LogLevelInfo})
	if err != nil {
		b.Fatal(err)
	}
	defer embedded.Close()
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = []string{"text/plain"}
		io.WriteString(w, "upstream")
	})
	alog, err := openAccessLog(filepath.Join(b.TempDir(), "access.log"), defaultFormat(b), logger)
	if err != nil {
		b.Fatal(err)
	}
	defer alog.Close()
	jsonFormat, err := accessFormatFrom("", `{"start":"%START_TIME%","method":"%REQ(:METHOD)%","path":"%REQ(:PATH)%","status":"%RESPONSE_CODE%",`+
		`"flags":"%RESPONSE_FLAGS%","in":"%BYTES_RECEIVED%","out":"%BYTES_SENT%","ms":"%DURATION%","id":"%REQ(X-REQUEST-ID)%","peer":"%DOWNSTREAM_REMOTE_ADDRESS%"}`)
	if err != nil {
		b.Fatal(err)
	}
	jsonLog, err := openAccessLog(filepath.Join(b.TempDir(), "access.json"), jsonFormat, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer jsonLog.Close()
	// Eight routes, the request's the last: the most a route table costs.
	rt := &router{}
	for _, r := range []string{"/api/**", "admin.example.com/**", "/v1/*/items", "prefix:/static", "*.example.com/**", "/login", "/a/**/b", "/health"} {
		if err := (*routeFlag)(&rt.routes).Set(r + "=http://127.0.0.1:1"); err != nil {
			b.Fatal(err)
		}
		rt.handlers = append(rt.handlers, upstream)
	}
	for _, c := range []struct {
		name string
		h    http.Handler
		path string // default /health, which no limit matches
	}{
		{"no-plugin", connectionManager(upstream, true, false), ""},
		{"no-plugin, 8 routes", connectionManager(rt, true, false), ""},
		{"no-match", connectionManager(host.Middleware(upstream), true, false), ""},
		{"call-out, embedded bridge", connectionManager(embedded.Middleware(upstream), true, false), "/api/x"},
		{"no-plugin, access log", alog.handler(connectionManager(upstream, true, false)), ""},
		{"no-plugin, JSON access log", jsonLog.handler(connectionManager(upstream, true, false)), ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			path := c.path
			if path == "" {
				path = "/health"
			}
			in := httptest.NewRequest("GET", path, nil)
			in.Header["X-User-Id"] = []string{"ua"}
			rec := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				r := *in
				r.Header = http.Header{"X-User-Id": in.Header["X-User-Id"]} // what the server reads anew
				clear(rec.HeaderMap)
				c.h.ServeHTTP(rec, &r)
			}
		})
	}
}

// shutdown waits for a request in flight within the grace, and says so
// when the grace ends first.
func TestShutdown_Grace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		release bool // the request finishes during the grace
		err     string
	}{
		{"finishes in time", time.Minute, true, ""},
		{"still running", 50 * time.Millisecond, false, "requests still in flight after --shutdown-grace 50ms: context deadline exceeded"},
	} {
		entered, release := make(chan struct{}), make(chan struct{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
		}), settings{idleTimeout: time.Minute})
		go srv.Serve(ln)
		answered := make(chan error, 1)
		go func() {
			res, err := http.Get("http://" + ln.Addr().String())
			if err == nil {
				res.Body.Close()
			}
			answered <- err
		}()
		<-entered
		if tc.release {
			close(release)
		}
		err = shutdown(srv, tc.grace)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || err.Error() != tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
		if !tc.release {
			close(release)
		}
		if err := <-answered; tc.release && err != nil {
			t.Errorf("%s: the request in flight: %v", tc.name, err)
		}
		srv.Close()
	}
}
