package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
)

// accessLogAt opens an access log in a test directory whose clock stands
// still, so that every line's time is at and its duration 0.
func accessLogAt(t *testing.T, path string, at time.Time) *accessLog {
	t.Helper()
	l, err := openAccessLog(path, defaultFormat(t), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	l.now = func() time.Time { return at }
	return l
}

// whenServed returns h, and a channel that has a value each time h has
// returned from a request: the access log line is written by then.
func whenServed(h http.Handler) (http.Handler, <-chan struct{}) {
	done := make(chan struct{}, 16)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { done <- struct{}{} }()
		h.ServeHTTP(w, r)
	}), done
}

// Every request has its line, in Envoy's default format, whoever
// answered it: the upstream (body counted both ways, over HTTP/1.1 and
// HTTP/2), the plugin (no upstream host), or the gateway when the
// upstream timed out (UT) or refused the connection (UF).
func TestAccessLog(t *testing.T) {
	host := guestHost(t, 1)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "from the upstream")
	}))
	defer up.Close()
	defer close(release)
	refused := nettest.FreeAddr(t) // nothing listens there

	at := time.Date(2030, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	path := filepath.Join(t.TempDir(), "access.log")
	alog := accessLogAt(t, path, at)
	s := settings{appendXFF: true, idleTimeout: defaultIdleTimeout, maxRequestHeadersKB: defaultMaxRequestHeadersKB, upstreamTimeout: 100 * time.Millisecond, now: alog.now,
		preserveRequestID: true} // the lines show the ids sent
	h, served := whenServed(newHandler(mustURL(t, up.URL), host, alog, discardLogger(), s))
	gw := serveGateway(t, h)
	h, servedRefused := whenServed(newHandler(mustURL(t, "http://"+refused), nil, alog, discardLogger(), s))
	gwRefused := serveGateway(t, h)

	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	h2client := &http.Client{Transport: &http.Transport{Protocols: &h2c}}
	defer h2client.CloseIdleConnections()
	upHost := strings.TrimPrefix(up.URL, "http://")
	var want []string
	for _, tc := range []struct {
		addr, method, target, mode, body string
		client                           *http.Client
		line                             string // after the time: "%s" is the bytes the client got
	}{
		{gw, "POST", "/api/items?page=2", "", "hello", http.DefaultClient,
			`"POST /api/items?page=2 HTTP/1.1" 200 - 5 %d 0 0 "127.0.0.1" "test-agent" "req-1" "` + gw + `" "` + upHost + `"`},
		{gw, "GET", "/over/h2", "", "", h2client,
			`"GET /over/h2 HTTP/2" 200 - 0 %d 0 0 "127.0.0.1" "test-agent" "req-2" "` + gw + `" "` + upHost + `"`},
		{gw, "GET", "/limited", "deny", "", http.DefaultClient,
			`"GET /limited HTTP/1.1" 429 - 0 %d 0 - "127.0.0.1" "test-agent" "req-3" "` + gw + `" "-"`},
		{gw, "GET", "/slow", "", "", http.DefaultClient,
			`"GET /slow HTTP/1.1" 504 UT 0 %d 0 - "127.0.0.1" "test-agent" "req-4" "` + gw + `" "` + upHost + `"`},
		{gwRefused, "GET", "/", "", "", http.DefaultClient,
			`"GET / HTTP/1.1" 503 UF 0 %d 0 - "127.0.0.1" "test-agent" "req-5" "` + gwRefused + `" "` + refused + `"`},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+tc.addr+tc.target, strings.NewReader(tc.body))
		req.Header.Set("User-Agent", "test-agent")
		req.Header.Set("X-Request-Id", fmt.Sprintf("req-%d", len(want)+1))
		if tc.mode != "" {
			req.Header.Set("X-Mode", tc.mode)
		}
		res, err := tc.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if tc.addr == gw {
			<-served
		} else {
			<-servedRefused
		}
		want = append(want, "[2030-01-02T03:04:05.006Z] "+fmt.Sprintf(tc.line, len(got)))
	}
	if err := alog.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("access log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// reopen moves the log on to a new file at the same path, as log rotation
// needs: the lines before it stay in the renamed file.
func TestAccessLog_Reopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	alog := accessLogAt(t, path, time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	h := alog.handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	get := func(target string) {
		req := httptest.NewRequest("GET", target, nil)
		req.Host = "gw"
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	get("/before")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := alog.reopen(); err != nil {
		t.Fatal(err)
	}
	get("/after")
	if err := alog.Close(); err != nil {
		t.Fatal(err)
	}
	line := func(target string) string {
		return `[2030-01-02T03:04:05.000Z] "GET ` + target + ` HTTP/1.1" 200 - 0 0 0 - "-" "-" "-" "gw" "-"` + "\n"
	}
	for file, want := range map[string]string{path + ".1": line("/before"), path: line("/after")} {
		if got, err := os.ReadFile(file); err != nil || string(got) != want {
			t.Errorf("%s: %q %v, want %q", file, got, err, want)
		}
	}
}

// An upgraded connection (WebSocket and the like) passes through the
// logged gateway both ways, and its line has the upstream's 101.
func TestAccessLog_Upgrade(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw) // echo until the client closes
	}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "access.log")
	alog := accessLogAt(t, path, time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	h, served := whenServed(newHandler(mustURL(t, up.URL), nil, alog, discardLogger(), settings{appendXFF: true, upstreamTimeout: defaultUpstreamTimeout, now: alog.now, preserveRequestID: true}))
	gw := serveGateway(t, h)
	c, err := net.Dial("tcp", gw)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second)) // the test's own bound
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-Request-Id: ws-1\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("%v %+v", err, res)
	}
	io.WriteString(c, "ping")
	got := make([]byte, 4)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping" {
		t.Fatalf("through the upgraded connection: %q %v", got, err)
	}
	c.Close()
	<-served // the tunnel has closed both ways
	if err := alog.Close(); err != nil {
		t.Fatal(err)
	}
	want := `[2030-01-02T03:04:05.000Z] "GET /ws HTTP/1.1" 101 - 0 0 0 0 "127.0.0.1" "-" "ws-1" "gw" "` + strings.TrimPrefix(up.URL, "http://") + `"` + "\n"
	if got, err := os.ReadFile(path); err != nil || string(got) != want {
		t.Errorf("access log: %q %v\nwant %q", got, err, want)
	}
}

// defaultFormat is Envoy's default access log format, compiled.
func defaultFormat(t testing.TB) *accessFormat {
	t.Helper()
	f, err := accessFormatFrom("", "")
	if err != nil || f.isDict {
		t.Fatalf("the default format: %v", err)
	}
	return f
}
