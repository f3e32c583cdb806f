package redisbridge

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/rules"
)

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

// A Shutdown that comes before Serve (a signal while the bridge starts)
// makes Serve return at once, its listener closed, rather than serve
// until killed.
func TestServer_ShutdownBeforeServe(t *testing.T) {
	set := testSettings()
	set.Logger, set.AuditLog = discardLogger(), filepath.Join(t.TempDir(), "audit.log")
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still serving after Shutdown")
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("the listener still accepts")
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
	// Idle connections holding the shutdown up would run out its time.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
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
