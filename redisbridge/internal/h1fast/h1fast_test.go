package h1fast

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
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

// TestServer_AnswersAndHandsOver: a check is answered with the handler's
// status, headers and body in HTTP/1.1 framing; the first request of
// another shape hands the connection, unread bytes included, to Handoff.
func TestServer_AnswersAndHandsOver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(ln, checkio.HandlerFunc(func(_ context.Context, req *checkio.Request, resp *checkio.Response) {
		resp.Status = http.StatusTeapot
		resp.Set("X-Got", string(req.Body)+"|"+string(req.Authorization)+"|"+string(req.RequestID))
		resp.SetInt("X-N", 42)
		resp.Body = append(resp.Body, "answer"...)
	}))
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const next = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
	io.WriteString(c, "POST /v1/rate-limit/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nX-Request-Id: r1\r\nContent-Length: 4\r\n\r\nbody"+next)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Got") != "body|Bearer t|r1" || resp.Header.Get("X-N") != "42" ||
		resp.Header.Get("Date") == "" || resp.ContentLength != 6 || string(b) != "answer" || resp.Close {
		t.Fatalf("answer: %d %v %q", resp.StatusCode, resp.Header, b)
	}
	hc, err := s.Handoff().Accept()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(next))
	if _, err := io.ReadFull(hc, got); err != nil || string(got) != next {
		t.Fatalf("handed over connection reads %q, %v; want the next request", got, err)
	}
	hc.Close()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestServer_MaxAge: a connection past its age gets its answer with
// Connection: close, and is closed; a younger one is kept.
func TestServer_MaxAge(t *testing.T) {
	for _, tt := range []struct {
		age    time.Duration
		closed bool
	}{{time.Nanosecond, true}, {time.Hour, false}, {0, false}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := New(ln, checkio.HandlerFunc(func(_ context.Context, _ *checkio.Request, resp *checkio.Response) { resp.Status = http.StatusOK }))
		s.SetMaxAge(tt.age)
		go s.Serve()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "POST /v1/rate-limit/check HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.Close != tt.closed {
			t.Errorf("max age %v: Connection: close is %v, want %v", tt.age, resp.Close, tt.closed)
		}
		if tt.closed {
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("max age %v: the connection was not closed after the answer: %v", tt.age, err)
			}
		}
		c.Close()
		s.Shutdown(context.Background())
	}
}

// TestServer_H2Preface: a connection that opens with the HTTP/2 client
// preface goes to the HTTP/2 server, the preface still to be read.
func TestServer_H2Preface(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(ln, checkio.HandlerFunc(func(context.Context, *checkio.Request, *checkio.Response) {}))
	got := make(chan string, 1)
	s.ServeH2(func(c net.Conn, r *bufio.Reader) {
		b := make([]byte, len(http2.ClientPreface)+4)
		_, err := io.ReadFull(r, b)
		got <- string(b) + fmt.Sprint(err)
	})
	go s.Serve()
	defer s.Shutdown(context.Background())
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// In two writes: the server waits for the whole preface.
	io.WriteString(c, http2.ClientPreface[:10])
	io.WriteString(c, http2.ClientPreface[10:]+"more")
	if g := <-got; g != http2.ClientPreface+"more<nil>" {
		t.Fatalf("the HTTP/2 server read %q", g)
	}
}
