package redisbridge

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/internal/tlsfiles/tlsfilestest"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

const (
	secAdminKey   = "admin-key-0123456789abcdef"
	secCheckToken = "check-token-fedcba9876543210"
)

// wrongSecrets are credentials that must not pass for secret: near
// misses too, since a compare that stops at the first differing byte, or
// at the shorter length, would let them through or leak through timing.
func wrongSecrets(secret string) map[string]string {
	last := secret[:len(secret)-1]
	flip := last + string(secret[len(secret)-1]^1)
	return map[string]string{
		"wrong": "wrong", "last byte flipped": flip, "prefix": last, "one byte longer": secret + "x",
		"upper case": strings.ToUpper(secret), "twice": secret + secret, "with a space inside": last + " " + secret[len(secret)-1:],
	}
}

// TestSecurity_AdminEndpoints: every admin endpoint, over HTTP/1.1 and
// h2c, refuses a missing key with 401 and a wrong one with 403, and a
// refused call changes nothing.
func TestSecurity_AdminEndpoints(t *testing.T) {
	set := testSettings()
	set.AdminKey, set.CheckToken = secAdminKey, secCheckToken
	ts := startServer(t, set)
	putBody := `{"user_id":"alice","endpoint":"/api","limit":5,"window_seconds":60,"algorithm":"fixed_window"}`
	endpoints := []struct{ method, path, body string }{
		{"PUT", "/v1/rate-limit/config", putBody},
		{"GET", "/v1/rate-limit/config/alice/api", ""},
		{"POST", "/v1/rate-limit/reset", `{"user_id":"alice","endpoint":"/api"}`},
		{"POST", "/v1/rate-limit/reset", `{"key":"rl:{u:alice}:api"}`},
	}
	for _, cl := range []struct {
		name string
		c    *http.Client
	}{{"http1", http.DefaultClient}, {"h2c", h2cClient(t)}} {
		for _, e := range endpoints {
			name := cl.name + " " + e.method + " " + e.path
			missing := map[string][]string{
				"no credential":              nil,
				"empty bearer":               {"Authorization", "Bearer "},
				"basic scheme":               {"Authorization", "Basic YWRtaW46" + secAdminKey},
				"key without scheme":         {"Authorization", secAdminKey},
				"bearer wins over admin key": {"Authorization", "Basic x", "X-Admin-Key", secAdminKey},
				"empty admin key header":     {"X-Admin-Key", ""},
			}
			for what, hdr := range missing {
				r := do(t, cl.c, e.method, ts.URL+e.path, e.body, hdr...)
				if r.status != 401 || r.errCode(t) != codeUnauthorized || r.header.Get("WWW-Authenticate") != "Bearer" {
					t.Errorf("%s, %s: %d %s %v, want 401 with WWW-Authenticate", name, what, r.status, r.body, r.header)
				}
			}
			wrong := wrongSecrets(secAdminKey)
			wrong["the check token"] = secCheckToken
			for what, key := range wrong {
				for _, hdr := range [][]string{{"Authorization", "Bearer " + key}, {"X-Admin-Key", key}} {
					r := do(t, cl.c, e.method, ts.URL+e.path, e.body, hdr...)
					if r.status != 403 || r.errCode(t) != codeForbidden {
						t.Errorf("%s, %s in %s: %d %s, want 403", name, what, hdr[0], r.status, r.body)
					}
				}
			}
		}
	}
	// Nothing above took effect: there is no override yet.
	if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/config/alice/api", "", "X-Admin-Key", secAdminKey); r.status != 404 {
		t.Fatalf("override after refused calls: %d %s", r.status, r.body)
	}
	for _, hdr := range [][]string{{"Authorization", "Bearer " + secAdminKey}, {"Authorization", "bearer  " + secAdminKey + " "}, {"X-Admin-Key", secAdminKey}} {
		for _, e := range endpoints {
			if r := do(t, h2cClient(t), e.method, ts.URL+e.path, e.body, hdr...); r.status != 200 {
				t.Errorf("%s %s with %q: %d %s", e.method, e.path, hdr[1], r.status, r.body)
			}
		}
	}
}

// TestSecurity_CheckToken: check, batch-check and status refuse a missing
// token (401) and a wrong one (403), over net/http and over the raw
// HTTP/1.1 fast path, and a refused check consumes nothing.
func TestSecurity_CheckToken(t *testing.T) {
	set := testSettings()
	set.AdminKey, set.CheckToken = secAdminKey, secCheckToken
	ts := startServer(t, set)
	key := "rl:{u:token-test}:x"
	check := checkBody(limit(key, rules.FixedWindow, 1))
	endpoints := []struct{ method, path, body string }{
		{"POST", "/v1/rate-limit/check", check},
		{"POST", "/v1/rate-limit/batch-check", `{"checks":[{"user_id":"token-test","endpoint":"/x","limit":1}]}`},
		{"GET", "/v1/rate-limit/status/token-test/x", ""},
	}
	for _, cl := range []struct {
		name string
		c    *http.Client
	}{{"http1", http.DefaultClient}, {"h2c", h2cClient(t)}} {
		for _, e := range endpoints {
			name := cl.name + " " + e.method + " " + e.path
			for what, hdr := range map[string][]string{"no token": nil, "empty bearer": {"Authorization", "Bearer "}, "basic scheme": {"Authorization", "Basic " + secCheckToken}} {
				if r := do(t, cl.c, e.method, ts.URL+e.path, e.body, hdr...); r.status != 401 || r.errCode(t) != codeUnauthorized {
					t.Errorf("%s, %s: %d %s, want 401", name, what, r.status, r.body)
				}
			}
			wrong := wrongSecrets(secCheckToken)
			wrong["the admin key"] = secAdminKey
			for what, tok := range wrong {
				if r := do(t, cl.c, e.method, ts.URL+e.path, e.body, "Authorization", "Bearer "+tok); r.status != 403 || r.errCode(t) != codeForbidden {
					t.Errorf("%s, %s: %d %s, want 403", name, what, r.status, r.body)
				}
			}
		}
	}

	// The raw keep-alive path the plugin uses (answered without net/http
	// when the head is one it fully understands).
	conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	raw := func(auth ...string) int {
		t.Helper()
		var b strings.Builder
		fmt.Fprintf(&b, "POST /v1/rate-limit/check HTTP/1.1\r\nHost: bridge\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", len(check))
		for _, a := range auth {
			b.WriteString("Authorization: " + a + "\r\n")
		}
		b.WriteString("\r\n" + check)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, b.String()); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for what, auth := range map[string][]string{
		"no token": nil, "wrong token": {"Bearer wrong"}, "near miss": {"Bearer " + wrongSecrets(secCheckToken)["last byte flipped"]},
		"wrong then right": {"Bearer wrong", "Bearer " + secCheckToken}, "admin key": {"Bearer " + secAdminKey},
	} {
		if got := raw(auth...); got != 401 && got != 403 {
			t.Errorf("raw keep-alive check, %s: %d, want 401 or 403", what, got)
		}
	}
	// None of the refused checks counted: the limit of 1 is still whole.
	if got := raw("Bearer " + secCheckToken); got != 200 {
		t.Fatalf("raw check with the token: %d", got)
	}
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check, "Authorization", "Bearer "+secCheckToken)
	var cr rules.CheckResponse
	if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || cr.Allowed {
		t.Errorf("second authorized check of a limit of 1: %d %s (refused checks were counted, or this one was not)", r.status, r.body)
	}
	for _, e := range endpoints[1:] {
		if r := do(t, h2cClient(t), e.method, ts.URL+e.path, e.body, "Authorization", "Bearer "+secCheckToken); r.status != 200 && r.status != 429 {
			t.Errorf("%s %s with the token: %d %s", e.method, e.path, r.status, r.body)
		}
	}
}

// TestSecurity_TLSListener: with --tls-cert and --tls-key the bridge
// serves HTTPS (h2 and HTTP/1.1) with a certificate clients verify, and
// refuses cleartext HTTP, h2c and old TLS versions without deciding
// anything.
func TestSecurity_TLSListener(t *testing.T) {
	ca := tlsfilestest.NewCA(t)
	set := testSettings()
	set.TLSCert, set.TLSKey = ca.Issue(t, t.TempDir(), "bridge")
	ts := startServer(t, set)
	addr := strings.TrimPrefix(ts.URL, "http://")
	key := "rl:{u:tls}:x"
	check := checkBody(limit(key, rules.FixedWindow, 2))

	// Cleartext on the TLS port: HTTP/1.1, h2c, and the raw check the
	// plugin's fast path would send. None may be decided.
	if r, err := http.Post("http://"+addr+"/v1/rate-limit/check", "application/json", strings.NewReader(check)); err == nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 400 {
			t.Errorf("cleartext HTTP/1.1 on the TLS port: %d %s, want 400", r.StatusCode, b)
		}
	}
	if r, err := h2cClient(t).Post("http://"+addr+"/v1/rate-limit/check", "application/json", strings.NewReader(check)); err == nil {
		r.Body.Close()
		t.Errorf("h2c on the TLS port answered %d", r.StatusCode)
	}

	// A client that does not trust the CA, and one limited to TLS 1.1.
	for what, cfg := range map[string]*tls.Config{
		"untrusted certificate": {},
		"TLS 1.1":               {RootCAs: ca.Pool, MaxVersion: tls.VersionTLS11},
	} {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		if r, err := c.Post("https://"+addr+"/v1/rate-limit/check", "application/json", strings.NewReader(check)); err == nil {
			r.Body.Close()
			t.Errorf("%s: answered %d, want a failed handshake", what, r.StatusCode)
		}
	}

	// Verified clients: h2 by ALPN, and HTTP/1.1. The limit of 2 is whole:
	// nothing above was counted.
	for i, tc := range []struct {
		name  string
		tr    *http.Transport
		proto int
	}{
		{"h2", &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}, ForceAttemptHTTP2: true}, 2},
		{"http/1.1", &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, NextProtos: []string{"http/1.1"}}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}, 1},
	} {
		t.Cleanup(tc.tr.CloseIdleConnections) // before the bridge's shutdown: see h2cClient
		r, err := (&http.Client{Transport: tc.tr}).Post("https://"+addr+"/v1/rate-limit/check", "application/json", strings.NewReader(check))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		var cr rules.CheckResponse
		if err := rules.DecodeCheckResponse(b, 1, &cr); err != nil || r.ProtoMajor != tc.proto || !cr.Allowed || cr.Decisions[0].Remaining != int64(1-i) {
			t.Errorf("%s: %s %d %s, want HTTP/%d allowed with %d remaining", tc.name, r.Proto, r.StatusCode, b, tc.proto, 1-i)
		}
	}
}

// TestSecurity_ClientCertificates: with --tls-client-ca and
// --tls-client-san, the bridge decides only for a client whose certificate
// its CA issued with one of the names, over h2 (Envoy's rate limit
// service and call-outs) and HTTP/1.1; a client with none, with another
// CA's or with other names fails its handshake and counts nothing. A CA
// file rotated and read again (SIGHUP) verifies the next handshakes.
func TestSecurity_ClientCertificates(t *testing.T) {
	ca, other := tlsfilestest.NewCA(t), tlsfilestest.NewCA(t)
	dir := t.TempDir()
	set := testSettings()
	set.TLSCert, set.TLSKey = ca.Issue(t, dir, "bridge")
	set.TLSClientCA, set.TLSClientSAN = filepath.Join(dir, "clients.pem"), "spiffe://cluster.local/ns/edge/sa/envoy, envoy.internal"
	ca.WriteCert(t, set.TLSClientCA)
	ts := startServer(t, set)
	url := "https://" + strings.TrimPrefix(ts.URL, "http://") + "/v1/rate-limit/check"
	key := "rl:{u:mtls}:x"
	check := checkBody(limit(key, rules.FixedWindow, 3))
	client := func(name string, by *tlsfilestest.CA, dns ...string) []tls.Certificate {
		pair, err := tls.LoadX509KeyPair(by.IssueFor(t, dir, name, nil, dns...))
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{pair}
	}
	envoy, stranger, impostor := client("envoy", ca, "envoy.internal"), client("stranger", ca, "stranger.internal"), client("impostor", other, "envoy.internal")
	post := func(certs []tls.Certificate, h2 bool) (remaining int64, err error) {
		t.Helper()
		cfg := &tls.Config{RootCAs: ca.Pool, Certificates: certs}
		tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
		if !h2 {
			cfg.NextProtos = []string{"http/1.1"}
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		defer tr.CloseIdleConnections()
		r, err := (&http.Client{Transport: tr}).Post(url, "application/json", strings.NewReader(check))
		if err != nil {
			return 0, err
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		var cr rules.CheckResponse
		if err := rules.DecodeCheckResponse(b, 1, &cr); err != nil || r.StatusCode != 200 || (r.ProtoMajor == 2) != h2 {
			t.Fatalf("%s %d %s (%v)", r.Proto, r.StatusCode, b, err)
		}
		return cr.Decisions[0].Remaining, nil
	}
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "another CA's": impostor, "other names": stranger} {
		for _, h2 := range []bool{true, false} {
			if _, err := post(certs, h2); err == nil {
				t.Errorf("a client with %s (h2 %t): decided", name, h2)
			}
		}
	}
	if n, err := post(envoy, true); err != nil || n != 2 {
		t.Fatalf("the proxy's client over h2: %d remaining, %v; want 2 (nothing counted before)", n, err)
	}
	if n, err := post(envoy, false); err != nil || n != 1 {
		t.Fatalf("the proxy's client over HTTP/1.1: %d remaining, %v; want 1", n, err)
	}

	other.WriteCert(t, set.TLSClientCA)
	if err := ts.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := post(envoy, true); err == nil {
		t.Error("the old CA's client after the rotation: decided")
	}
	if n, err := post(impostor, true); err != nil || n != 0 {
		t.Fatalf("the new CA's client: %d remaining, %v; want 0", n, err)
	}
}

// startTLSRedis starts a redis-server that listens only with TLS, with a
// certificate from ca, and stops it when t ends.
func startTLSRedis(t *testing.T, ca *tlsfilestest.CA) string { return startTLSRedisAuth(t, ca, false) }

// startTLSRedisAuth starts a TLS-only redis-server; with authClients it
// also requires a client certificate signed by ca (mutual TLS).
func startTLSRedisAuth(t *testing.T, ca *tlsfilestest.CA, authClients bool) string {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, "redis")
	caFile := filepath.Join(dir, "ca.crt")
	ca.WriteCert(t, caFile)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(redistest.Binary, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", map[bool]string{false: "no", true: "yes"}[authClients],
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", "", "--loglevel", "warning")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	probe := &tls.Config{RootCAs: ca.Pool}
	if authClients {
		cf, kf := ca.Issue(t, dir, "probe")
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		probe.Certificates = []tls.Certificate{pair}
	}
	for {
		c, err := tls.Dial("tcp", addr, probe)
		if err == nil {
			c.Write([]byte("PING\r\n"))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if line == "+PONG\r\n" {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server with TLS on %s did not come up: %v %s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redissChildURL carries the rediss:// URL to the child process of
// TestSecurity_RedisTLS that runs with SSL_CERT_FILE set to the test CA.
const redissChildURL = "SLUICE_TEST_REDISS_URL"

// TestSecurity_RedisTLS: the bridge reaches a TLS-only Redis through a
// rediss:// URL. The server certificate is verified by default (a CA the
// process does not trust makes the store unavailable), and is trusted
// through the system roots: SSL_CERT_FILE, in a child process because Go
// reads the roots once per process, or --redis-tls-ca; with a Redis that
// requires client certificates, --redis-tls-cert/--redis-tls-key.
func TestSecurity_RedisTLS(t *testing.T) {
	if u := os.Getenv(redissChildURL); u != "" {
		expectStore(t, u, 200)
		return
	}
	ca := tlsfilestest.NewCA(t)
	addr := startTLSRedis(t, ca)
	url := "rediss://" + addr + "/0"
	t.Run("untrusted CA", func(t *testing.T) { expectStore(t, url, 503) })
	t.Run("skip_verify", func(t *testing.T) { expectStore(t, url+"?skip_verify=true", 200) })
	t.Run("cleartext URL", func(t *testing.T) { expectStore(t, "redis://"+addr+"/0", 503) })
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.PEM")
	ca.WriteCert(t, caFile)
	t.Run("CA in --redis-tls-ca", func(t *testing.T) {
		expectStoreWith(t, url, 200, func(s *Settings) { s.RedisTLSCA = caFile })
	})
	t.Run("mutual TLS", func(t *testing.T) {
		mtls := "rediss://" + startTLSRedisAuth(t, ca, true) + "/0"
		expectStoreWith(t, mtls, 503, func(s *Settings) { s.RedisTLSCA = caFile })
		cert, key := ca.Issue(t, dir, "bridge")
		expectStoreWith(t, mtls, 200, func(s *Settings) { s.RedisTLSCA, s.RedisTLSCert, s.RedisTLSKey = caFile, cert, key })
	})
	t.Run("bad settings stop the start", func(t *testing.T) {
		for _, tc := range []struct {
			set  func(*Settings)
			want string
		}{
			{func(s *Settings) { s.RedisTLSCA = filepath.Join(dir, "missing.pem") }, "--redis-tls-ca"},
			{func(s *Settings) { s.RedisTLSCA = filepath.Join(dir, "ca.PEM"); s.RedisURL = "redis://" + addr }, "--redis-tls-ca"},
			{func(s *Settings) { s.RedisTLSCert = caFile }, "--redis-tls-cert, --redis-tls-key"},
		} {
			set := testSettings()
			set.Store, set.RedisURL = "redis", url
			tc.set(&set)
			if _, err := New(set); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		}
	})
	t.Run("CA in SSL_CERT_FILE", func(t *testing.T) {
		caFile := filepath.Join(t.TempDir(), "ca.PEM")
		ca.WriteCert(t, caFile)
		cmd := exec.Command(os.Args[0], "-test.run=^TestSecurity_RedisTLS$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), redissChildURL+"="+url, "SSL_CERT_FILE="+caFile, "SSL_CERT_DIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestSecurity_RedisTLS") {
			t.Fatalf("child with SSL_CERT_FILE: %v\n%s", err, out)
		}
	})
}

// expectStore starts a bridge on redisURL and expects a check and /readyz
// to answer want (200, or 503 when the store is unreachable).
func expectStore(t *testing.T, redisURL string, want int) {
	t.Helper()
	expectStoreWith(t, redisURL, want, nil)
}

// expectStoreWith is expectStore with settings adjusted by tweak.
func expectStoreWith(t *testing.T, redisURL string, want int, tweak func(*Settings)) {
	t.Helper()
	set := testSettings()
	set.Store, set.RedisURL = "redis", redisURL
	set.RedisTimeout = 2 * time.Second
	if tweak != nil {
		tweak(&set)
	}
	ts := startServer(t, set)
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", checkBody(limit("rl:{u:tls-"+strconv.Itoa(want)+"}:x", rules.SlidingLog, 5)))
	if r.status != want {
		t.Errorf("check through %s: %d %s, want %d", redisURL, r.status, r.body, want)
	}
	if want == 503 && r.errCode(t) != codeServiceUnavailable {
		t.Errorf("check through %s: %s, want %s", redisURL, r.body, codeServiceUnavailable)
	}
	if r := do(t, nil, "GET", ts.URL+"/readyz", ""); r.status != want {
		t.Errorf("/readyz through %s: %d %s, want %d", redisURL, r.status, r.body, want)
	}
}

// aclCommands is what the bridge needs from Redis: its scripts (and the
// commands they call), the override hash, reset and ping. Found by
// running every endpoint with this user and reading ACL LOG.
var aclCommands = []string{
	"+evalsha", "+eval", "+time", "+get", "+set", "+del", "+pexpire", "+ping", "+multi", "+exec",
	"+hget", "+hmget", "+hset", "+hgetall", "+hincrby",
	"+zadd", "+zcard", "+zcount", "+zpopmax", "+zrange", "+zrangebyscore", "+zremrangebyrank", "+zremrangebyscore",
	"+zrevrangebyscore", "+zrem",
}

// TestSecurity_RedisACL: the bridge authenticates as a Redis ACL user
// named in the URL, limited to the bridge's key prefixes and commands.
// Every endpoint works with it; a wrong password or an unknown user makes
// the store unavailable (503, /readyz fails).
func TestSecurity_RedisACL(t *testing.T) {
	rs := redistest.Start(t)
	args := append([]string{"ACL", "SETUSER", "sluice", "reset", "on", ">s3cret-pass", "~rl:*", "~sluice:*", "-@all"}, aclCommands...)
	if v, err := redistest.Do(rs.Addr, 2*time.Second, args...); err != nil || v != "OK" {
		t.Fatalf("ACL SETUSER: %v %v", v, err)
	}
	if _, err := redistest.Do(rs.Addr, 2*time.Second, "ACL", "LOG", "RESET"); err != nil {
		t.Fatal(err)
	}
	base := "127.0.0.1:" + strings.Split(rs.Addr, ":")[1]

	t.Run("user and password", func(t *testing.T) {
		set := testSettings()
		set.Store, set.RedisURL = "redis", "redis://sluice:s3cret-pass@"+base+"/0"
		set.RedisTimeout = 2 * time.Second
		ts := startServer(t, set)
		pen := &rules.Penalty{Enabled: true, DetectionWindowMS: 60_000, ViolationThreshold: 1, Multipliers: []int64{1, 2}}
		for _, a := range []rules.Algorithm{rules.TokenBucket, rules.SlidingWindow, rules.SlidingLog, rules.FixedWindow} {
			l := limit("rl:{u:acl}:"+a.String(), a, 1)
			l.Spec.Penalty = pen
			for i, want := range []bool{true, false, false} {
				r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", checkBody(l))
				var cr rules.CheckResponse
				if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || cr.Allowed != want {
					t.Errorf("%s check %d: %d %s, want allowed %v", a, i+1, r.status, r.body, want)
				}
			}
			// A lease granted, renewed and handed back.
			l = limit("rl:{u:acl-lease}:"+a.String(), a, 10)
			l.Spec.Lease = rules.Lease{Size: 3, TTLMS: 60_000}
			var cr rules.CheckResponse
			r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", checkBody(l))
			if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || cr.Decisions[0].Lease.Units != 3 {
				t.Fatalf("%s lease: %d %s", a, r.status, r.body)
			}
			back := l
			back.Return = rules.LeaseReturn{Tag: cr.Decisions[0].Lease.Tag, Granted: 3, Units: 3}
			for _, op := range []rules.Op{rules.OpRenew, rules.OpReturn} {
				body := rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{Op: op, Limits: []rules.LimitRequest{back}})
				if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", string(body)); r.status != 200 {
					t.Errorf("%s %v: %d %s", a, op, r.status, r.body)
				}
			}
		}
		admin := []string{"X-Admin-Key", "admin-secret"}
		for _, c := range []struct{ method, path, body string }{
			{"PUT", "/v1/rate-limit/config", `{"user_id":"alice","endpoint":"/api","limit":5,"window_seconds":60,"algorithm":"token_bucket"}`},
			{"GET", "/v1/rate-limit/status/alice/api", ""},
			{"POST", "/v1/rate-limit/batch-check", `{"checks":[{"user_id":"alice","endpoint":"/api"}]}`},
			{"POST", "/v1/rate-limit/reset", `{"user_id":"alice","endpoint":"/api"}`},
			{"GET", "/readyz", ""},
		} {
			if r := do(t, nil, c.method, ts.URL+c.path, c.body, admin...); r.status != 200 {
				t.Errorf("%s %s as the ACL user: %d %s", c.method, c.path, r.status, r.body)
			}
		}
		if v, err := redistest.Do(rs.Addr, 2*time.Second, "ACL", "LOG"); err != nil || fmt.Sprint(v) != "[]" {
			t.Errorf("ACL LOG after every endpoint: %v %v (a command or key the bridge needs is missing from the user)", v, err)
		}
	})
	for what, u := range map[string]string{
		"wrong password": "redis://sluice:wrong@" + base + "/0",
		"unknown user":   "redis://mallory:s3cret-pass@" + base + "/0",
	} {
		t.Run(what, func(t *testing.T) { expectStore(t, u, 503) })
	}
}

// The TLS pair is read again on Reload (SIGHUP) and ReloadChanged
// (--watch) when its files changed: the next handshake gets the renewed
// certificate; a pair that does not load leaves the served one, logged
// once; unchanged files are not read again into a new pair.
func TestSecurity_TLSReload(t *testing.T) {
	ca := tlsfilestest.NewCA(t)
	dir := t.TempDir()
	var logs syncbuf.Buffer
	set := testSettings()
	set.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	set.TLSCert, set.TLSKey = ca.Issue(t, dir, "bridge")
	ts := startServer(t, set)
	addr := strings.TrimPrefix(ts.URL, "http://")
	served := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	step := func(name string, reload func() error, wantErr bool, cn string, reloaded, refused int) {
		t.Helper()
		if err := reload(); (err != nil) != wantErr {
			t.Fatalf("%s: error %v, want one: %t", name, err, wantErr)
		}
		if got := served(); got != cn {
			t.Errorf("%s: served %q, want %q", name, got, cn)
		}
		if n := logCount(&logs, "TLS certificate reloaded"); n != reloaded {
			t.Errorf("%s: %d reloads logged, want %d", name, n, reloaded)
		}
		if n := logCount(&logs, "TLS certificate refused"); n != refused {
			t.Errorf("%s: %d refusals logged, want %d", name, n, refused)
		}
	}
	step("nothing changed", ts.ReloadChanged, false, "bridge", 0, 0)
	renewed, renewedKey := ca.Issue(t, t.TempDir(), "renewed")
	for _, f := range [][2]string{{renewed, set.TLSCert}, {renewedKey, set.TLSKey}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	step("renewed", ts.ReloadChanged, false, "renewed", 1, 0)
	other, _ := ca.Issue(t, t.TempDir(), "other")
	b, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(set.TLSCert, b, 0o600); err != nil { // its key is not the file's
		t.Fatal(err)
	}
	step("a certificate without its key", ts.ReloadChanged, true, "renewed", 1, 1)
	step("still refused: logged once", ts.ReloadChanged, false, "renewed", 1, 1)
	step("SIGHUP reads it whatever changed", ts.Reload, true, "renewed", 1, 2)
}
