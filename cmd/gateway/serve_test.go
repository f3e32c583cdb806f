package main

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
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/hosttest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/tlsfiles"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/wasmhost"
)

// served is the common name of the certificate a server at addr presents.
func served(t *testing.T, addr string) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// The gateway speaks HTTP/1.1 and HTTP/2, in the clear (HTTP/2 by prior
// knowledge) and over TLS (by ALPN), and the plugin sees each request as
// Envoy would show it: request.protocol, request.scheme and an
// X-Forwarded-Proto that is the connection's, whatever the client sent,
// a request without a body ending with its headers, and the request id
// the upstream gets. The plugin answers locally over each as well.
func TestGateway_Protocols(t *testing.T) {
	host := guestHost(t, 2)
	// The upstream answers with what the plugin wrote into the request
	// (the guest's echo mode) and the X-Forwarded-Proto it got.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, k := range []string{"X-Prop-Request.protocol", "X-Prop-Request.scheme", "X-Forwarded-Proto", "X-Eos", "X-Request-Id", "X-Prop-Request.id"} {
			w.Header()["Seen-"+k] = r.Header[k]
		}
	}))
	defer up.Close()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca := tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "gateway")
	cert, err := tlsfiles.Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	s := settings{appendXFF: true, idleTimeout: defaultIdleTimeout, maxRequestHeadersKB: defaultMaxRequestHeadersKB}
	h := newHandler(mustURL(t, up.URL), host, nil, discardLogger(), s)
	serve := func(tlsOn bool) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := newServer(h, s)
		if tlsOn {
			srv.TLSConfig = tlsfiles.Config(cert)
			go srv.ServeTLS(ln, "", "")
		} else {
			go srv.Serve(ln)
		}
		t.Cleanup(func() { srv.Close() })
		return ln.Addr().String()
	}
	plain, secure := serve(false), serve(true)

	for _, tc := range []struct {
		name, url      string
		h1, h2, h2c    bool
		proto, scheme  string
		spoofedForward string
	}{
		{"HTTP/1.1 in the clear", "http://" + plain, true, false, false, "HTTP/1.1", "http", "https"},
		{"HTTP/2 in the clear (prior knowledge)", "http://" + plain, false, false, true, "HTTP/2", "http", "https"},
		{"HTTP/1.1 over TLS", "https://" + secure, true, false, false, "HTTP/1.1", "https", "http"},
		{"HTTP/2 over TLS (ALPN)", "https://" + secure, false, true, false, "HTTP/2", "https", "http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p http.Protocols
			p.SetHTTP1(tc.h1)
			p.SetHTTP2(tc.h2)
			p.SetUnencryptedHTTP2(tc.h2c)
			client := &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: roots}}}
			defer client.CloseIdleConnections()
			do := func(mode string) *http.Response {
				req, _ := http.NewRequest("GET", tc.url+"/x", nil)
				req.Header.Set("X-Mode", mode)
				req.Header.Set("X-Forwarded-Proto", tc.spoofedForward)
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				wantMajor := 1
				if !tc.h1 {
					wantMajor = 2
				}
				if res.ProtoMajor != wantMajor {
					t.Errorf("x-mode %s: answered over %s", mode, res.Proto)
				}
				return res
			}
			res := do("echo")
			got := [5]string{res.Status, res.Header.Get("Seen-X-Prop-Request.protocol"), res.Header.Get("Seen-X-Prop-Request.scheme"),
				res.Header.Get("Seen-X-Forwarded-Proto"), res.Header.Get("Seen-X-Eos")}
			if want := [5]string{"200 OK", tc.proto, tc.scheme, tc.scheme, "true"}; got != want {
				t.Errorf("status, request.protocol, request.scheme, X-Forwarded-Proto, end of stream with the headers: got %q, want %q", got, want)
			}
			if id := res.Header.Get("Seen-X-Request-Id"); len(id) != 32 || res.Header.Get("Seen-X-Prop-Request.id") != id {
				t.Errorf("the upstream got X-Request-Id %q, the plugin request.id %q; want one id", id, res.Header.Get("Seen-X-Prop-Request.id"))
			}
			if res := do("deny"); res.StatusCode != http.StatusTooManyRequests {
				t.Errorf("x-mode deny: %s, want 429 from the plugin", res.Status)
			}
		})
	}
}

// X-Forwarded-For, X-Forwarded-Proto and X-Request-Id as Envoy's
// connection manager sets them: at the edge the peer is appended and the
// protocol is the connection's; behind a proxy both pass as they came, the
// protocol added when missing; a request id is made at the edge unless
// the client's is preserved, and behind a proxy kept, or made. Identity
// headers given to --strip-header never reach the plugin.
func TestConnectionManager(t *testing.T) {
	const made = "(made)"
	for _, tc := range []struct {
		name                string
		edge, tls, preserve bool
		sent                http.Header // by the client, besides X-User-Id
		want                http.Header
	}{
		{"edge, nothing sent", true, false, false, http.Header{},
			http.Header{"X-Forwarded-For": {"198.51.100.4"}, "X-Forwarded-Proto": {"http"}, "X-Request-Id": {made}}},
		{"edge, spoofed", true, false, false, http.Header{"X-Forwarded-For": {"6.6.6.6"}, "X-Forwarded-Proto": {"https"}, "X-Request-Id": {"r-1"}},
			http.Header{"X-Forwarded-For": {"6.6.6.6, 198.51.100.4"}, "X-Forwarded-Proto": {"http"}, "X-Request-Id": {made}}},
		{"edge, the client's request id preserved", true, false, true, http.Header{"X-Request-Id": {"r-1"}},
			http.Header{"X-Forwarded-For": {"198.51.100.4"}, "X-Forwarded-Proto": {"http"}, "X-Request-Id": {"r-1"}}},
		{"edge over TLS", true, true, false, http.Header{"X-Forwarded-Proto": {"http"}, "X-Request-Id": {""}},
			http.Header{"X-Forwarded-For": {"198.51.100.4"}, "X-Forwarded-Proto": {"https"}, "X-Request-Id": {made}}},
		{"behind a proxy", false, false, false, http.Header{"X-Forwarded-For": {"203.0.113.9"}, "X-Forwarded-Proto": {"https"}, "X-Request-Id": {"r-2"}},
			http.Header{"X-Forwarded-For": {"203.0.113.9"}, "X-Forwarded-Proto": {"https"}, "X-Request-Id": {"r-2"}}},
		{"behind a proxy, no protocol sent", false, true, false, http.Header{},
			http.Header{"X-Forwarded-Proto": {"https"}, "X-Request-Id": {made}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got http.Header
			h := stripHeaders(connectionManager(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }), tc.edge, tc.preserve), []string{"X-User-Id"})
			req := httptest.NewRequest("GET", "/", nil)
			req.RemoteAddr = "198.51.100.4:5555"
			req.Header = tc.sent.Clone()
			req.Header.Set("X-User-Id", "someone-else")
			if tc.tls {
				req.TLS = &tls.ConnectionState{}
			}
			h.ServeHTTP(httptest.NewRecorder(), req)
			if id := got.Get("X-Request-Id"); tc.want.Get("X-Request-Id") == made && len(id) == 32 && strings.Trim(id, "0123456789abcdef") == "" {
				got.Set("X-Request-Id", made)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("the plugin got %v, want %v", got, tc.want)
			}
		})
	}
}

// runLogged runs the gateway (run) with args until stop, which returns
// run's error; await waits for a message in its log (or one that starts
// with msg), in order, within the test's own bound.
func runLogged(t *testing.T, args ...string) (await func(msg string), stop func() error) {
	t.Helper()
	logr, logw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logr.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		defer logw.Close()
		done <- run(ctx, args, logw)
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(logr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	await = func(msg string) {
		t.Helper()
		guard := time.After(30 * time.Second) // the plugin compiles first
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("the log ended before %q; run: %v", msg, <-done)
				}
				if strings.Contains(line, `"msg":"`+msg) {
					return
				}
			case <-guard:
				t.Fatalf("no %q in the log", msg)
			}
		}
	}
	stop = func() error {
		cancel()
		go func() { // the rest of the log, until run closes it
			for range lines {
			}
		}()
		return <-done
	}
	return await, stop
}

// With --tls-client-ca and --tls-client-san the gateway answers only a
// client whose certificate that CA issued with one of the names (DNS or
// URI): one with none, another CA's, or other names fails its handshake.
// SIGHUP reads the CA file again, for the next handshakes.
func TestRun_ClientCertificates(t *testing.T) {
	dir := t.TempDir()
	plugin, config := guestFiles(t, dir)
	ca, other := tlsfilestest.NewCA(t), tlsfilestest.NewCA(t)
	cert, key := ca.Issue(t, dir, "gateway")
	clientCA := filepath.Join(dir, "clients.pem")
	ca.WriteCert(t, clientCA)
	listen := nettest.FreeAddr(t)
	await, stop := runLogged(t, "--listen", listen, "--plugin", plugin, "--config", config, "--upstream", "http://127.0.0.1:1",
		"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", clientCA, "--tls-client-san", "partner.example",
		"--tls-client-san", "spiffe://example.org/partner", "--log-level", "info", "--watch", "0")
	await("gateway listening")
	spiffe, _ := url.Parse("spiffe://example.org/partner")
	client := func(name string, by *tlsfilestest.CA, dns []string, uris ...*url.URL) []tls.Certificate {
		pair, err := tls.LoadX509KeyPair(by.IssueWith(t, dir, name, func(c *x509.Certificate) { c.IPAddresses, c.DNSNames, c.URIs = nil, dns, uris }))
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{pair}
	}
	clients := map[string][]tls.Certificate{
		"dns":         client("dns", ca, []string{"partner.example"}),
		"uri":         client("uri", ca, nil, spiffe),
		"other names": client("stranger", ca, []string{"stranger.example"}),
		"another CA":  client("impostor", other, []string{"partner.example"}),
		"none":        nil,
	}
	deny := func(name string) error { // the guest answers this mode itself (a 429), so no upstream is needed
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: clients[name]}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest("GET", "https://"+listen+"/x", nil)
		req.Header.Set("X-Mode", "deny")
		res, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: %s", name, res.Status)
		}
		return nil
	}
	for name, ok := range map[string]bool{"dns": true, "uri": true, "other names": false, "another CA": false, "none": false} {
		if err := deny(name); (err == nil) != ok {
			t.Errorf("client with %s: %v, want answered %t", name, err, ok)
		}
	}
	await("http: TLS handshake error") // in the gateway's own log
	other.WriteCert(t, clientCA)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	await("client CAs reloaded")
	if err := deny("dns"); err == nil {
		t.Error("the old CA's client after the rotation: answered")
	}
	if err := deny("another CA"); err != nil {
		t.Errorf("the new CA's client after the rotation: %v", err)
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

// The gateway as started with --tls-cert, --tls-key and --access-log
// serves HTTPS and logs each request; SIGHUP makes it serve the renewed
// pair written over the files (and read --upstream-tls-ca again), and
// SIGUSR1 reopens the access log after it was moved away, without a
// restart.
func TestRun_Signals(t *testing.T) {
	dir := t.TempDir()
	plugin, config := guestFiles(t, dir)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	accessFile := filepath.Join(dir, "access.log")
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "first")
	caFile := filepath.Join(dir, "ca.pem")
	tlsfilestest.WriteSelfSigned(t, caFile, filepath.Join(dir, "ca.key"), "ca")
	listen := nettest.FreeAddr(t)
	// --watch 0: what SIGHUP reads, not the watch.
	await, stop := runLogged(t, "--listen", listen, "--plugin", plugin, "--config", config, "--upstream", "http://127.0.0.1:1",
		"--tls-cert", certFile, "--tls-key", keyFile, "--upstream-tls-ca", caFile, "--access-log", accessFile, "--log-level", "info", "--watch", "0")
	await("gateway listening")
	if got := served(t, listen); got != "first" {
		t.Fatalf("served %q, want first", got)
	}
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "renewed")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	await("certificate reloaded")
	await("upstream CAs reloaded")
	if got := served(t, listen); got != "renewed" {
		t.Errorf("after SIGHUP served %q, want renewed", got)
	}

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	deny := func(path string) { // the guest answers this mode itself (a 429), so no upstream is needed
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+listen+path, nil)
		req.Header.Set("X-Mode", "deny")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: %s", path, res.Status)
		}
	}
	deny("/before-rotation")
	if err := os.Rename(accessFile, accessFile+".1"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	await("access log reopened")
	deny("/after-rotation")
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
	// run has returned: the access log is flushed and closed.
	for file, path := range map[string]string{accessFile + ".1": "/before-rotation", accessFile: "/after-rotation"} {
		got, err := os.ReadFile(file)
		if lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n"); err != nil || len(lines) != 1 || !strings.Contains(lines[0], `] "GET `+path+` HTTP/1.1" 429 - 0 6 `) {
			t.Errorf("%s: %q %v; want the one request to %s", file, got, err, path)
		}
	}
}

// --upstream-protocol: the upstream is spoken to over HTTP/1.1, over
// HTTP/2 (h2c), or in the client's own protocol; a gRPC-shaped exchange (a
// streamed body, TE: trailers) passes through the gateway and its plugin
// either way, and the status trailer reaches the client when both sides
// speak HTTP/2, what gRPC needs (Envoy, too, passes no trailers to an
// HTTP/1.1 client unless told to).
func TestGateway_UpstreamProtocol(t *testing.T) {
	host := guestHost(t, 1)
	// The upstream speaks HTTP/1.1 and h2c, answers with the protocol it
	// was asked in, echoes the body, and ends with a trailer.
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var both http.Protocols
	both.SetHTTP1(true)
	both.SetUnencryptedHTTP2(true)
	up := &http.Server{Protocols: &both, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upstream-Proto", r.Proto)
		w.Header().Set("Upstream-Te", r.Header.Get("Te"))
		w.Header().Set("Content-Type", "application/grpc")
		body, _ := io.ReadAll(r.Body)
		w.Write(body)
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	})}
	go up.Serve(upLn)
	defer up.Close()

	for _, tc := range []struct {
		mode       string
		h2         bool // the client's protocol
		upstreamAt string
	}{
		{upstreamHTTP1, false, "HTTP/1.1"}, {upstreamHTTP1, true, "HTTP/1.1"},
		{upstreamHTTP2, false, "HTTP/2.0"}, {upstreamHTTP2, true, "HTTP/2.0"},
		{upstreamDownstream, false, "HTTP/1.1"}, {upstreamDownstream, true, "HTTP/2.0"},
	} {
		t.Run(fmt.Sprintf("%s, client HTTP/2 %v", tc.mode, tc.h2), func(t *testing.T) {
			s := settings{appendXFF: true, idleTimeout: defaultIdleTimeout, maxRequestHeadersKB: defaultMaxRequestHeadersKB,
				upstreamTimeout: defaultUpstreamTimeout, upstreamProtocol: tc.mode}
			gw := serveGateway(t, newHandler(mustURL(t, "http://"+upLn.Addr().String()), host, nil, discardLogger(), s))
			var p http.Protocols
			p.SetHTTP1(!tc.h2)
			p.SetUnencryptedHTTP2(tc.h2)
			client := &http.Client{Transport: &http.Transport{Protocols: &p}}
			defer client.CloseIdleConnections()
			pr, pw := io.Pipe()
			go func() { // a streamed body: no length known
				io.WriteString(pw, "message one;")
				io.WriteString(pw, "message two")
				pw.Close()
			}()
			req, _ := http.NewRequest("POST", "http://"+gw+"/pkg.Service/Method", pr)
			req.Header.Set("Content-Type", "application/grpc")
			req.Header.Set("Te", "trailers")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			got := [5]string{res.Status, res.Header.Get("Upstream-Proto"), res.Header.Get("Upstream-Te"), string(body), res.Trailer.Get("Grpc-Status")}
			want := [5]string{"200 OK", tc.upstreamAt, "trailers", "message one;message two", ""}
			if tc.h2 && tc.upstreamAt == "HTTP/2.0" {
				want[4] = "0"
			}
			if err != nil || got != want {
				t.Errorf("status, upstream protocol, TE, body, trailer: %q %v, want %q", got, err, want)
			}
		})
	}
}

// --validate starts the plugin with the configuration and reads the TLS
// pair as a start would, then exits: nil when all is accepted (no
// --upstream needed), else an error that says why, the plugin's own words
// included.
func TestRun_Validate(t *testing.T) {
	dir := t.TempDir()
	plugin, good := guestFiles(t, dir)
	refused := filepath.Join(dir, "refused")
	if err := os.WriteFile(refused, []byte("refuse"), 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "gw")
	listen := nettest.FreeAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		err  string
	}{
		{"accepted", []string{"--config", good}, ""},
		{"accepted, with TLS", []string{"--config", good, "--tls-cert", certFile, "--tls-key", keyFile}, ""},
		{"refused", []string{"--config", refused}, "plugin refused the configuration (it logged: refusing configuration)"},
		{"no key for the certificate", []string{"--config", good, "--tls-cert", certFile, "--tls-key", certFile}, "--tls-cert " + certFile + ", --tls-key " + certFile},
		{"access log format", []string{"--config", good, "--access-log-json", `{"status":"%RESPONSE_CODE%","cluster":"%UPSTREAM_CLUSTER%"}`},
			"--access-log-json: cluster: %UPSTREAM_CLUSTER%: not a command operator the gateway has"},
	} {
		args := append([]string{"--validate", "--plugin", plugin, "--listen", listen, "--access-log", filepath.Join(dir, "access.log"), "--log-level", "error"}, tc.args...)
		err := run(context.Background(), args, os.Stderr)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	// Nothing was served or written.
	if c, err := net.Dial("tcp", listen); err == nil {
		c.Close()
		t.Errorf("%s answers after --validate", listen)
	}
	if _, err := os.Stat(filepath.Join(dir, "access.log")); !os.IsNotExist(err) {
		t.Errorf("the access log was created: %v", err)
	}
}

// The plugin's checks reach a bridge on a Unix socket (--cluster
// NAME=unix:///path, the bridge's --listen unix:///path): allowed, then
// refused with the bridge's decision, as over TCP.
func TestGateway_BridgeOnUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "bridge.sock")
	set := redisbridge.DefaultSettings()
	set.Logger, set.AuditLog, set.Listen = discardLogger(), filepath.Join(dir, "audit.log"), "unix://"+sock
	br, err := redisbridge.New(set) // the embedded memory store
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go br.Serve(ln)
	defer br.Shutdown(context.Background())
	host, err := wasmhost.New(context.Background(), e2etest.Plugin(t), wasmhost.Options{Workers: 1, CompilationCache: e2etest.CompilationCache(t), PluginConfig: []byte(limitConfig(2)), RootID: "sluice",
		Logger: discardLogger(), Clusters: map[string]string{"sluice_bridge": "unix://" + sock}})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") }))
	defer up.Close()
	gw := serveGateway(t, newHandler(mustURL(t, up.URL), host, nil, discardLogger(),
		settings{appendXFF: true, upstreamTimeout: defaultUpstreamTimeout}))
	checkTwoAllowed(t, gw)
}

// With --upstream-tls-ca the gateway verifies an https upstream and an
// https call-out cluster by a private CA; without it, by the system's
// roots, which do not know that CA.
func TestRun_UpstreamTLSCA(t *testing.T) {
	dir := t.TempDir()
	plugin, config := guestFiles(t, dir)
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "upstream")
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	serveTLS := func(h http.Handler) string {
		srv := httptest.NewUnstartedServer(h)
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	backend := serveTLS(hosttest.Backend(t).Config.Handler)
	upstream := serveTLS(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "call-out status "+r.Header.Get("X-Callout-Status"))
	}))
	for _, tc := range []struct {
		name string
		args []string
		code int
		body string
	}{
		{"the private CA", []string{"--upstream-tls-ca", certFile}, 200, "call-out status 202"},
		{"the system's roots", nil, 503, "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addrs := nettest.FreeAddrs(t, 2)
			listen, admin := addrs[0], addrs[1]
			stop := startRun(t, admin, append([]string{"--listen", listen, "--admin-listen", admin, "--plugin", plugin, "--config", config,
				"--upstream", upstream, "--cluster", "backend=" + backend, "--log-level", "error"}, tc.args...)...)
			defer stop()
			code, body, err := get("http://"+listen+"/", "X-Mode", "callout", "X-Callout-Path", "/check/1")
			if err != nil || code != tc.code || body != tc.body {
				t.Errorf("%d %q %v, want %d %q", code, body, err, tc.code, tc.body)
			}
		})
	}
	if err := run(t.Context(), []string{"--validate", "--plugin", plugin, "--config", config, "--upstream-tls-ca", keyFile}, os.Stderr); err == nil ||
		!strings.Contains(err.Error(), "--upstream-tls-ca: no PEM certificate in "+keyFile) {
		t.Errorf("a file with no certificate: %v", err)
	}
}

// --upstream-tls-ca verifies an https upstream's chain and name against
// the CAs read last: a CA written over the file and read again (SIGHUP)
// is trusted from the next connection on; a file that does not load
// leaves the CAs in use; a name the certificate is not for is refused.
func TestUpstreamTLSCA_Reload(t *testing.T) {
	dir := t.TempDir()
	upCert, upKey := filepath.Join(dir, "up.pem"), filepath.Join(dir, "up.key")
	tlsfilestest.WriteSelfSigned(t, upCert, upKey, "upstream") // for 127.0.0.1 only
	pair, err := tls.LoadX509KeyPair(upCert, upKey)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	up.StartTLS()
	defer up.Close()

	caFile := filepath.Join(dir, "ca.pem")
	if _, err := tlsfiles.LoadCAs("--upstream-tls-ca", caFile); err == nil || !strings.HasPrefix(err.Error(), "--upstream-tls-ca: ") {
		t.Fatalf("missing file: %v", err)
	}
	tlsfilestest.WriteSelfSigned(t, caFile, filepath.Join(dir, "other.key"), "another CA")
	cas, err := tlsfiles.LoadCAs("--upstream-tls-ca", caFile)
	if err != nil {
		t.Fatal(err)
	}
	tr := newUpstreamTransport(0, false, cas.ClientConfig())
	get := func(url string) error {
		t.Helper()
		tr.fallback.(*http.Transport).CloseIdleConnections() // a new connection, verified anew
		req := httptest.NewRequest("GET", url, nil)
		req.RequestURI = ""
		res, err := tr.RoundTrip(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if b, _ := io.ReadAll(res.Body); string(b) != "ok" {
			t.Fatalf("answer %q", b)
		}
		return nil
	}
	var unknown x509.UnknownAuthorityError
	if err := get(up.URL); !errors.As(err, &unknown) {
		t.Fatalf("with another CA: %v, want unknown authority", err)
	}
	data, err := os.ReadFile(upCert)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cas.Reload(false); err != nil {
		t.Fatal(err)
	}
	if err := get(up.URL); err != nil {
		t.Fatalf("after reload: %v", err)
	}
	var wrongName x509.HostnameError
	if err := get(strings.Replace(up.URL, "127.0.0.1", "localhost", 1)); !errors.As(err, &wrongName) {
		t.Fatalf("by a name the certificate is not for: %v, want a hostname error", err)
	}
	if err := os.WriteFile(caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cas.Reload(false); err == nil || err.Error() != "--upstream-tls-ca: no PEM certificate in "+caFile {
		t.Fatalf("reload of a file with no certificate: %v", err)
	}
	if err := get(up.URL); err != nil {
		t.Fatalf("after a refused reload: %v", err)
	}
}

// With --watch the gateway reads again, without a signal, the files that
// changed: a renewed certificate is served from the next handshake, and
// a plugin configuration written anew is loaded; files written again the
// same are not reloaded.
func TestRun_Watch(t *testing.T) {
	dir := t.TempDir()
	plugin, config := guestFiles(t, dir)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "first")
	listen := nettest.FreeAddr(t)
	await, stop := runLogged(t, "--listen", listen, "--plugin", plugin, "--config", config, "--upstream", "http://127.0.0.1:1",
		"--tls-cert", certFile, "--tls-key", keyFile, "--log-level", "info", "--watch", "20ms")
	await("gateway listening")
	tlsfilestest.WriteSelfSigned(t, certFile, keyFile, "renewed")
	await("certificate reloaded")
	if got := served(t, listen); got != "renewed" {
		t.Errorf("after the watch served %q, want renewed", got)
	}
	if err := os.WriteFile(config, []byte(guestConfig+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	await("configuration reloaded")
	if err := stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}
