package redisbridge

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/internal/loadgen"
	"github.com/sluicehq/sluice/rules"
)

func TestParseHead(t *testing.T) {
	const line = "POST /v1/rate-limit/check HTTP/1.1\r\n"
	for _, tc := range []struct {
		name, head string
		ok         bool
		n          int
		close      bool
		id, auth   string
	}{
		{"minimal", line + "Host: b\r\nContent-Length: 12\r\n\r\n", true, 12, false, "", ""},
		{"case and spaces", line + "HOST:b\r\ncontent-LENGTH: \t7 \r\nX-Request-ID:  r1 \r\nAuthorization: Bearer t\r\n\r\n", true, 7, false, "r1", "Bearer t"},
		{"close", line + "Host: b\r\nContent-Length: 0\r\nConnection: Close\r\n\r\n", true, 0, true, "", ""},
		{"keep-alive", line + "Host: b\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\n", true, 1, false, "", ""},
		{"first request id wins", line + "Host: b\r\nContent-Length: 1\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n", true, 1, false, "a", ""},
		{"no host", line + "Content-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"two hosts", line + "Host: a\r\nHost: b\r\nContent-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"no length", line + "Host: b\r\n\r\n", false, 0, false, "", ""},
		{"two lengths", line + "Host: b\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"signed length", line + "Host: b\r\nContent-Length: +1\r\n\r\n", false, 0, false, "", ""},
		{"huge length", line + "Host: b\r\nContent-Length: 99999999999999999999\r\n\r\n", false, 0, false, "", ""},
		{"chunked", line + "Host: b\r\nTransfer-Encoding: chunked\r\n\r\n", false, 0, false, "", ""},
		{"expect", line + "Host: b\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n", false, 0, false, "", ""},
		{"upgrade", line + "Host: b\r\nContent-Length: 1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", false, 0, false, "", ""},
		{"odd connection", line + "Host: b\r\nContent-Length: 1\r\nConnection: te\r\n\r\n", false, 0, false, "", ""},
		{"folded", line + "Host: b\r\nContent-Length: 1\r\nX-A: 1\r\n 2\r\n\r\n", false, 0, false, "", ""},
		{"bad name", line + "Host: b\r\nContent-Length: 1\r\nX A: 1\r\n\r\n", false, 0, false, "", ""},
		{"control byte", line + "Host: b\r\nContent-Length: 1\r\nX-Request-Id: a\x01b\r\n\r\n", false, 0, false, "", ""},
		{"bare LF", line + "Host: b\nContent-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"query", "POST /v1/rate-limit/check?x=1 HTTP/1.1\r\nHost: b\r\nContent-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"http/1.0", "POST /v1/rate-limit/check HTTP/1.0\r\nHost: b\r\nContent-Length: 1\r\n\r\n", false, 0, false, "", ""},
		{"get", "GET /v1/rate-limit/check HTTP/1.1\r\nHost: b\r\n\r\n", false, 0, false, "", ""},
		{"two auth", line + "Host: b\r\nContent-Length: 1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n", false, 0, false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h checkHead
			ok := parseHead([]byte(tc.head), &h)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if h.contentLength != tc.n || h.close != tc.close || string(h.requestID) != tc.id || string(h.auth) != tc.auth {
				t.Fatalf("got %+v", h)
			}
		})
	}
}

// FuzzParseHead checks the fast path against net/http: a head it accepts
// must be one net/http reads the same way.
func FuzzParseHead(f *testing.F) {
	const line = "POST /v1/rate-limit/check HTTP/1.1\r\n"
	for _, s := range []string{
		line + "Host: b\r\nContent-Length: 12\r\n\r\n",
		line + "HOST:b\r\ncontent-LENGTH: \t7 \r\nX-Request-ID:  r1 \r\nAuthorization: Bearer t\r\nConnection: close\r\n\r\n",
		line + "Host: b\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		line + "Host: b\r\nContent-Length: 1\r\nX-A: \xff\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: b\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		i := bytes.Index(b, []byte("\r\n\r\n"))
		if i < 0 {
			return
		}
		b = b[:i+4]
		var h checkHead
		if !parseHead(b, &h) {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(append(b, make([]byte, h.contentLength)...))))
		if err != nil {
			t.Fatalf("fast path accepts a head net/http refuses: %v\n%q", err, b)
		}
		if req.Method != "POST" || req.URL.Path != "/v1/rate-limit/check" || req.ContentLength != int64(h.contentLength) ||
			req.Close != h.close || req.Header.Get("X-Request-Id") != string(h.requestID) || req.Header.Get("Authorization") != string(h.auth) {
			t.Fatalf("net/http reads %s %s length %d close %v id %q auth %q; fast path %+v\n%q", req.Method, req.URL.Path,
				req.ContentLength, req.Close, req.Header.Get("X-Request-Id"), req.Header.Get("Authorization"), h, b)
		}
	})
}

// rawResponse reads one response from r.
func rawResponse(t *testing.T, r *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func postCheck(body string, extra string) string {
	return "POST /v1/rate-limit/check HTTP/1.1\r\nHost: x\r\n" + extra + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// TestServer_FastPathAndHandOver sends, on one connection and in one write,
// requests the fast path answers and requests it hands to net/http.
func TestServer_FastPathAndHandOver(t *testing.T) {
	ts := startServer(t, testSettings())
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := checkBody(limit("rl:{u:fast}:a", rules.FixedWindow, 2))
	chunked := "POST /v1/rate-limit/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
	// Two fast checks (the second with a request id), then a chunked one
	// that net/http must take over with the bytes already read, then more.
	if _, err := io.WriteString(c, postCheck(body, "")+postCheck(body, "X-Request-Id: id-2\r\n")+chunked+
		"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"+postCheck(`{"limits":[]}`, "")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, b := rawResponse(t, r)
	if resp.StatusCode != 200 || !strings.HasPrefix(b, `{"allowed":true`) || resp.Header.Get("X-RateLimit-Remaining") != "1" ||
		resp.Header.Get("X-RateLimit-Strategy") != "fixed_window" || !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") ||
		resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Date") == "" {
		t.Fatalf("first: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = rawResponse(t, r)
	if resp.StatusCode != 200 || !strings.HasPrefix(b, `{"allowed":true`) || resp.Header.Get("X-RateLimit-Remaining") != "0" ||
		resp.Header.Get("X-Request-Id") != "id-2" {
		t.Fatalf("second: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = rawResponse(t, r)
	if resp.StatusCode != 200 || !strings.HasPrefix(b, `{"allowed":false`) || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("chunked: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if resp, b = rawResponse(t, r); resp.StatusCode != 200 || !strings.Contains(b, `"ok"`) {
		t.Fatalf("healthz: %d %s", resp.StatusCode, b)
	}
	if resp, b = rawResponse(t, r); resp.StatusCode != 400 || !strings.Contains(b, "limits: must hold") {
		t.Fatalf("invalid: %d %s", resp.StatusCode, b)
	}
}

func TestServer_FastPathConnectionClose(t *testing.T) {
	ts := startServer(t, testSettings())
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := checkBody(limit("rl:{u:close}:a", rules.TokenBucket, 2))
	if _, err := io.WriteString(c, postCheck(body, "Connection: close\r\n")+postCheck(body, "")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, _ := rawResponse(t, r)
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("%d close=%v", resp.StatusCode, resp.Close)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after Connection: close: read %d, %v; want EOF", n, err)
	}
}

// TestServer_ShutdownWithIdleConnections: keep-alive connections that sit
// idle do not hold a shutdown up, and a request in flight finishes.
func TestServer_ShutdownWithIdleConnections(t *testing.T) {
	set := testSettings()
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	var conns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body := checkBody(limit("rl:{u:sd"+strconv.Itoa(i)+"}:a", rules.TokenBucket, 2))
		io.WriteString(c, postCheck(body, ""))
		if resp, _ := rawResponse(t, bufio.NewReader(c)); resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		conns = append(conns, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle connection not closed: %v", err)
		}
	}
}

func BenchmarkParseHead(b *testing.B) {
	head := []byte("POST /v1/rate-limit/check HTTP/1.1\r\nHost: bridge\r\nUser-Agent: envoy\r\nContent-Type: application/json\r\nX-Request-Id: 7b2c1d\r\nContent-Length: 213\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		var h checkHead
		if !parseHead(head, &h) {
			b.Fatal("refused")
		}
	}
}

// TestServer_FastPathHammer: 50 connections race for one counter; exactly
// the limit is admitted.
func TestServer_FastPathHammer(t *testing.T) {
	ts := startServer(t, testSettings())
	bodies := [][]byte{[]byte(checkBody(limit("rl:{u:hammer}:a", rules.FixedWindow, 500)))}
	var allowed, denied atomic.Int64
	res, err := loadgen.Run(context.Background(), loadgen.Options{
		Addr: strings.TrimPrefix(ts.URL, "http://"), Path: "/v1/rate-limit/check", Bodies: bodies, Conns: 50, N: 2000,
		Check: func(status int, body []byte) error {
			switch {
			case status == 200 && bytes.HasPrefix(body, []byte(`{"allowed":true`)):
				allowed.Add(1)
			case status == 200 && bytes.HasPrefix(body, []byte(`{"allowed":false`)):
				denied.Add(1)
			default:
				return fmt.Errorf("status %d: %s", status, body)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 2000 || allowed.Load() != 500 || denied.Load() != 1500 {
		t.Fatalf("%d answers, %d allowed, %d denied; want 2000, 500, 1500", res.N, allowed.Load(), denied.Load())
	}
}
