package wasmhost

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

func newH1Client() *h1client {
	return &h1client{}
}

// countingServer is an httptest server that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func h1req(srv *httptest.Server, path string) *h1Request {
	return &h1Request{addr: strings.TrimPrefix(srv.URL, "http://"), method: "POST", path: path, authority: "bridge.local",
		headers: fields.Map{{"content-type", "application/json"}, {"x-request-id", "r1"}}, body: []byte(`{"a":1}`),
		deadline: time.Now().Add(5 * time.Second)}
}

// The request goes out as Envoy's codec writes it, and kept-alive
// connections carry the next call-outs: no dial per call-out.
func TestH1Client_KeepsConnections(t *testing.T) {
	srv, conns := countingServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.URL.RequestURI()+" "+r.Host+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("X-Request-Id")+" "+string(b)+" ua="+r.Header.Get("User-Agent"))
		io.WriteString(w, "ok")
	}))
	c := newH1Client()
	defer c.close()
	for i := 0; i < 20; i++ {
		res, started, err := c.do(h1req(srv, "/v1/check?x=1"), 1<<20)
		if err != nil || !started {
			t.Fatalf("call %d: %v", i, err)
		}
		if st, _ := res.headers.Get(":status"); st != "200" || string(res.body) != "ok" {
			t.Fatalf("call %d: %v %q", i, res.headers, res.body)
		}
		if seen, _ := res.headers.Get("x-seen"); seen != `POST /v1/check?x=1 bridge.local application/json r1 {"a":1} ua=` {
			t.Fatalf("the server saw %q", seen)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 20 sequential call-outs, want 1", n)
	}
}

// Answers net/http's client also takes: chunked, informational answers
// first, Connection: close (the connection is not reused).
func TestH1Client_Answers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					switch req.URL.Path {
					case "/chunked":
						io.WriteString(nc, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
					case "/close":
						io.WriteString(nc, "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
						return
					case "/big":
						io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
					}
				}
			}()
		}
	}()
	c := newH1Client()
	defer c.close()
	req := func(path string) *h1Request {
		return &h1Request{addr: ln.Addr().String(), method: "POST", path: path, authority: "a", deadline: time.Now().Add(5 * time.Second)}
	}
	res, _, err := c.do(req("/chunked"), 1<<20)
	if err != nil || string(res.body) != "abcde" {
		t.Fatalf("chunked: %v %+v", err, res)
	}
	if v, _ := res.headers.Get("x-a"); v != "1" {
		t.Errorf("chunked headers: %v", res.headers)
	}
	res, _, err = c.do(req("/close"), 1<<20)
	if st, _ := res.headers.Get(":status"); err != nil || st != "429" || string(res.body) != "no" {
		t.Fatalf("close: %v %+v", err, res)
	}
	if _, _, err := c.do(req("/chunked"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (the one the server closed is not reused)", n)
	}
	if _, started, err := c.do(req("/big"), 9); err == nil || !started {
		t.Errorf("a body over the limit: started %v, err %v", started, err)
	}
}

// Closing fails a call-out in flight at once, not at its deadline.
func TestH1Client_CloseEndsCallsInFlight(t *testing.T) {
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then net/http watches the connection
		close(arrived)
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := newH1Client()
	errc := make(chan error, 1)
	go func() {
		r := h1req(srv, "/")
		r.deadline = time.Now().Add(time.Minute)
		_, _, err := c.do(r, 1<<20)
		errc <- err
	}()
	<-arrived
	c.close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call-out outlived the client")
	}
	if _, _, err := c.do(h1req(srv, "/"), 1<<20); !errors.Is(err, errHostClosed) {
		t.Errorf("after close: %v", err)
	}
}

// What the plugin may put in a call-out's headers but HTTP/1.1 cannot
// carry is refused before anything is sent.
func TestH1Client_InvalidRequest(t *testing.T) {
	for _, r := range []h1Request{
		{method: "PO ST", authority: "a"},
		{method: "POST", authority: "a\r\nX: y"},
		{method: "POST", authority: "a", headers: fields.Map{{"x-a", "1\r\nx-b: 2"}}},
		{method: "POST", authority: "a", headers: fields.Map{{"x a", "1"}}},
	} {
		if validH1Request(&r) {
			t.Errorf("%+v accepted", r)
		}
	}
	if !validH1Request(&h1Request{method: "POST", authority: "a", headers: fields.Map{{"x-a", "1"}}}) {
		t.Error("a valid request refused")
	}
}
