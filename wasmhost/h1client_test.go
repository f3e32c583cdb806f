package wasmhost

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

func newH1Client() *h1client {
	return &h1client{}
}

// newH1Request renders a call-out as httpCall does, from the serialized
// header map the guest hands over.
func newH1Request(addr, method, path, authority string, headers fields.Map, body []byte) *h1Request {
	hb := append(fields.Map{{":method", method}, {":path", path}, {":authority", authority}}, headers...).Append(nil)
	raw, valid := appendH1Request(nil, []byte(method), path, []byte(authority), hb, body)
	return &h1Request{addr: addr, head: method == "HEAD", raw: raw, valid: valid, deadline: time.Now().Add(5 * time.Second)}
}

func h1req(srv *httptest.Server, path string) *h1Request {
	return newH1Request(strings.TrimPrefix(srv.URL, "http://"), "POST", path, "bridge.local",
		fields.Map{{"content-type", "application/json"}, {"x-request-id", "r1"}}, []byte(`{"a":1}`))
}

// The request goes out as Envoy's codec writes it, and kept-alive
// connections carry the next call-outs: no dial per call-out.
func TestH1Client_KeepsConnections(t *testing.T) {
	srv, conns := nettest.Counting(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	addr, accepted := nettest.Raw(t, func(nc net.Conn) {
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
	})
	c := newH1Client()
	defer c.close()
	req := func(path string) *h1Request { return newH1Request(addr, "POST", path, "a", nil, nil) }
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

// A call-out goes out as Envoy's HTTP/1 codec writes it: names
// lower-case, pseudo headers and the codec's own headers left out, the
// body's length given; what HTTP/1.1 cannot carry is marked, not sent.
func TestAppendH1Request(t *testing.T) {
	for _, tc := range []struct {
		name, method, authority string
		headers                 fields.Map
		body                    string
		want                    string
		valid                   bool
	}{
		{"post", "POST", "bridge", fields.Map{{"Content-Type", "application/json"}, {"X-Request-Id", "r1"}}, `{"a":1}`,
			"POST /v1/check?x=1 HTTP/1.1\r\nHost: bridge\r\ncontent-type: application/json\r\nx-request-id: r1\r\nContent-Length: 7\r\n\r\n{\"a\":1}", true},
		{"the codec's own headers", "POST", "b", fields.Map{{"Host", "x"}, {"content-length", "9"}, {"Transfer-Encoding", "chunked"}, {"connection", "close"}, {"x-a", "1"}}, "",
			"POST /v1/check?x=1 HTTP/1.1\r\nHost: b\r\nx-a: 1\r\nContent-Length: 0\r\n\r\n", true},
		{"get without body", "GET", "b", nil, "", "GET /v1/check?x=1 HTTP/1.1\r\nHost: b\r\n\r\n", true},
		{"bad method", "PO ST", "a", nil, "", "", false},
		{"bad authority", "POST", "a\r\nX: y", nil, "", "", false},
		{"bad value", "POST", "a", fields.Map{{"x-a", "1\r\nx-b: 2"}}, "", "", false},
		{"bad name", "POST", "a", fields.Map{{"x a", "1"}}, "", "", false},
		{"tab in value", "POST", "a", fields.Map{{"x-a", "1\t2"}}, "", "POST /v1/check?x=1 HTTP/1.1\r\nHost: a\r\nx-a: 1\t2\r\nContent-Length: 0\r\n\r\n", true},
	} {
		r := newH1Request("x:1", tc.method, "/v1/check?x=1", tc.authority, tc.headers, []byte(tc.body))
		if r.valid != tc.valid || tc.valid && string(r.raw) != tc.want {
			t.Errorf("%s: valid %v %q, want %v %q", tc.name, r.valid, r.raw, tc.valid, tc.want)
		}
	}
}

// validName and validValue judge bytes as httpguts judges strings.
func TestValidNameValue(t *testing.T) {
	for c := 0; c < 256; c++ {
		for _, s := range []string{string(rune(c)), "a" + string([]byte{byte(c)}) + "b"} {
			b := []byte(s)
			if validName(b) != httpguts.ValidHeaderFieldName(string(b)) || validValue(b) != httpguts.ValidHeaderFieldValue(string(b)) {
				t.Errorf("%q: validName %v validValue %v, httpguts %v %v", b, validName(b), validValue(b),
					httpguts.ValidHeaderFieldName(string(b)), httpguts.ValidHeaderFieldValue(string(b)))
			}
		}
	}
	if validName(nil) {
		t.Error("an empty name is valid")
	}
}

// A cluster with maxClusterRequests call-outs in flight answers the next
// as Envoy's circuit breaker does, and counts only its own.
func TestFetch_Overflow(t *testing.T) {
	h := newHost(t, Options{Workers: 1, Clusters: map[string]string{"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:1"}})
	full, other := h.clusters["a"], h.clusters["b"]
	full.inflight.Store(maxClusterRequests)
	r := h.fetch(&callout{cluster: full, kind: viaH1, h1: *newH1Request("127.0.0.1:1", "POST", "/", "a", nil, nil)})
	if st, _ := r.headers.Get(":status"); st != "503" || !strings.Contains(string(r.body), "overflow") {
		t.Errorf("overflow: %v %q", r.headers, r.body)
	}
	if v, _ := r.headers.Get("x-envoy-overloaded"); v != "true" {
		t.Errorf("overflow headers: %v", r.headers)
	}
	if n := full.inflight.Load(); n != maxClusterRequests {
		t.Errorf("%d in flight after the overflow, want %d", n, maxClusterRequests)
	}
	r = h.fetch(&callout{cluster: other, kind: viaH1, h1: *newH1Request("127.0.0.1:1", "POST", "/", "b", nil, nil)})
	if st, _ := r.headers.Get(":status"); st != "503" || strings.Contains(string(r.body), "overflow") {
		t.Errorf("the other cluster: %v %q, want a connection failure", r.headers, r.body)
	}
	if n := other.inflight.Load(); n != 0 {
		t.Errorf("%d in flight on the other cluster after its call-out, want 0", n)
	}
}
