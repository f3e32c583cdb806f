package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/wasmhost"
)

// rawUpstream is an upstream that answers each request it reads with what
// answer writes on the connection, and keeps what it received.
type rawUpstream struct {
	addr  string
	conns *atomic.Int64 // accepted
	mu    sync.Mutex
	seen  []string // each request as it arrived, Date-free
}

// startRawUpstream starts an upstream that answers each request of a
// connection until answer returns false.
func startRawUpstream(tb testing.TB, answer func(c net.Conn, br *bufio.Reader, req *http.Request, body []byte) bool) *rawUpstream {
	u := &rawUpstream{}
	u.addr, u.conns = nettest.Raw(tb, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			body, _ := io.ReadAll(req.Body)
			dump, _ := httputil.DumpRequest(req, false)
			u.mu.Lock()
			u.seen = append(u.seen, string(dump)+string(body))
			u.mu.Unlock()
			if !answer(c, br, req, body) {
				return
			}
		}
	})
	return u
}

// serveGateway serves h on a loopback port as the gateway does (newServer)
// until tb ends, and returns the address.
func serveGateway(tb testing.TB, h http.Handler) string {
	ln, err := listen("127.0.0.1:0") // as run binds: clients' sockets raw
	if err != nil {
		tb.Fatal(err)
	}
	srv := newServer(h, settings{idleTimeout: defaultIdleTimeout, maxRequestHeadersKB: defaultMaxRequestHeadersKB})
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func (u *rawUpstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// testProxy is a ReverseProxy with transport in front of upstream, which
// answers 502 for whatever fails.
func testProxy(transport http.RoundTripper, upstream string, rewrite func(*httputil.ProxyRequest)) *httputil.ReverseProxy {
	up, _ := url.Parse(upstream)
	proxy := &httputil.ReverseProxy{Transport: transport, Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(up)
		pr.Out.Host = "upstream"
		if rewrite != nil {
			rewrite(pr)
		}
	}, ErrorLog: log.New(io.Discard, "", 0)}
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "upstream unavailable", http.StatusBadGateway)
	}
	return proxy
}

// sniffless keeps net/http from sniffing a Content-Type for an answer
// without one: whether it does depends on a race in ReverseProxy (its
// first flush of a streamed answer against the first body write), and the
// tests compare what the transports do.
func sniffless(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		h.ServeHTTP(w, r)
	})
}

// rawExchange sends req on a connection of its own to addr and returns
// what came back (answerOf).
func rawExchange(t *testing.T, addr, req string) string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, req)
	b, _ := io.ReadAll(c)
	return answerOf(b, strings.HasPrefix(req, "HEAD "))
}

// answerOf describes the answers in raw: each status, its headers but Date,
// its body and trailers; or that the answer was cut off. How a body was
// framed is left out (Content-Length, Transfer-Encoding), and so is the
// head of an answer cut off in its body (ReverseProxy aborts it): both
// depend on a race in ReverseProxy, whether its first flush of a body of
// unknown length comes before the body's end or its failure.
func answerOf(raw []byte, head bool) string {
	var sb strings.Builder
	br := bufio.NewReader(bytes.NewReader(raw))
	method := "GET"
	if head {
		method = "HEAD"
	}
	for {
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			if err != io.EOF {
				sb.WriteString("cut off\n")
			}
			return sb.String()
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return sb.String() + "cut off\n"
		}
		res.Header.Del("Date")
		res.Header.Del("Content-Length")
		fmt.Fprintf(&sb, "%s %v\nbody %q, trailer %v\n", res.Status, res.Header, body, res.Trailer)
	}
}

// through sends raw requests to a ReverseProxy with transport in front of
// u and returns the raw answers.
func through(t *testing.T, transport http.RoundTripper, u *rawUpstream, rewrite func(*httputil.ProxyRequest), reqs ...string) []string {
	addr := serveGateway(t, sniffless(testProxy(transport, "http://"+u.addr, rewrite)))
	var out []string
	for _, r := range reqs {
		out = append(out, rawExchange(t, addr, r))
	}
	return out
}

// noGzip drops the Accept-Encoding: gzip the Transport adds to a request
// that has none (and takes off the answer).
func noGzip(req string) string { return strings.Replace(req, "Accept-Encoding: gzip\r\n", "", 1) }

// The gateway's upstream transport answers as net/http's Transport does:
// for each upstream behaviour the client gets the same bytes through a
// ReverseProxy with either, and the upstream the same request but for the
// Accept-Encoding the Transport adds.
func TestUpstreamTransport_AsNetHTTP(t *testing.T) {
	const get = "GET /a?b=1 HTTP/1.1\r\nHost: gw\r\nX-User-Id: u1\r\nConnection: close\r\n\r\n"
	const head = "HEAD /a HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
	const post = "POST /p HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
	reply := func(s string) func(net.Conn, *bufio.Reader, *http.Request, []byte) bool {
		return func(c net.Conn, _ *bufio.Reader, _ *http.Request, _ []byte) bool {
			io.WriteString(c, s)
			return true
		}
	}
	for _, tc := range []struct {
		name    string
		answer  func(net.Conn, *bufio.Reader, *http.Request, []byte) bool
		rewrite func(*httputil.ProxyRequest)
		reqs    []string
	}{
		{"content-length", reply("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"), nil, []string{get, get}},
		{"chunked with trailers", reply("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nX-T: done\r\n\r\n"), nil, []string{get, get}},
		{"head", reply("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"), nil, []string{head, head}},
		{"no content", reply("HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n"), nil, []string{get, get}},
		{"not modified", reply("HTTP/1.1 304 Not Modified\r\nEtag: \"x\"\r\n\r\n"), nil, []string{get}},
		{"connection close", func(c net.Conn, _ *bufio.Reader, _ *http.Request, _ []byte) bool {
			io.WriteString(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
			return false
		}, nil, []string{get, get}},
		{"http/1.0 body to EOF", func(c net.Conn, _ *bufio.Reader, _ *http.Request, _ []byte) bool {
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nuntil the end")
			return false
		}, nil, []string{get, get}},
		{"early hints", reply("HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), nil, []string{get}},
		{"many informational answers", reply(strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 6) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), nil, []string{get}},
		{"closed without an answer", func(net.Conn, *bufio.Reader, *http.Request, []byte) bool { return false }, nil, []string{get}},
		{"malformed answer", reply("HTTP/1.1 2x0 OK\r\n\r\n"), nil, []string{get}},
		{"short body", func(c net.Conn, _ *bufio.Reader, _ *http.Request, _ []byte) bool {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
			return false
		}, nil, []string{get}},
		{"unasked switch of protocols", reply("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"), nil, []string{get}},
		{"a body goes through the Transport", reply("HTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nk"), nil, []string{post, post}},
		{"a header value the Transport refuses", reply("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
			func(pr *httputil.ProxyRequest) { pr.Out.Header.Set("X-Bad", "a\r\nX-Smuggled: 1") }, []string{get}},
		{"a method the Transport refuses", reply("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
			func(pr *httputil.ProxyRequest) { pr.Out.Method = "GE T" }, []string{get}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u1 := startRawUpstream(t, tc.answer)
			u2 := startRawUpstream(t, tc.answer)
			want := through(t, wasmhost.NewTransport(), u1, tc.rewrite, tc.reqs...)
			got := through(t, newUpstreamTransport(0, false, nil), u2, tc.rewrite, tc.reqs...)
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("answer %d:\n got %q\nwant %q", i, got[i], want[i])
				}
			}
			netHTTP, ours := u1.received(), u2.received()
			if len(ours) != len(netHTTP) {
				t.Fatalf("the upstream got %d requests, %d through net/http", len(ours), len(netHTTP))
			}
			for i := range ours {
				g, w := noGzip(ours[i]), noGzip(netHTTP[i])
				if g != w {
					t.Errorf("request %d:\n got %q\nwant %q", i, g, w)
				}
			}
		})
	}
}

// Kept-alive connections carry the next requests: one connection for
// requests in turn; a connection the upstream closes is not reused, and a
// GET that finds its reused connection dead before any answer goes out
// again on a new one.
func TestUpstreamTransport_Connections(t *testing.T) {
	var n atomic.Int64
	u := startRawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request, _ []byte) bool {
		switch req.URL.Path {
		case "/drop-next":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			n.Store(1)
			return true
		}
		if n.CompareAndSwap(1, 0) {
			return false // reads the request, closes without answering
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	tr := newUpstreamTransport(0, false, nil)
	do := func(path string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+u.addr+path, nil)
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(b) != "ok" {
			t.Fatalf("%s: %q", path, b)
		}
	}
	for range 10 {
		do("/")
	}
	if c := u.conns.Load(); c != 1 {
		t.Fatalf("%d connections for 10 requests in turn, want 1", c)
	}
	do("/drop-next")
	do("/") // the upstream drops it on the kept-alive connection: sent again
	if c := u.conns.Load(); c != 2 {
		t.Errorf("%d connections, want 2", c)
	}
	if got := len(u.received()); got != 13 {
		t.Errorf("the upstream got %d requests, want 13 (one sent twice)", got)
	}
}

// A client that leaves while the upstream is slow cuts the exchange: the
// upstream sees its connection closed, and the connection is not reused.
func TestUpstreamTransport_ClientGone(t *testing.T) {
	arrived, closed := make(chan struct{}), make(chan struct{})
	u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request, _ []byte) bool {
		close(arrived)
		if _, err := br.ReadByte(); err != nil {
			close(closed) // the gateway closed the connection
		}
		return false
	})
	addr := serveGateway(t, newHandler(mustURL(t, "http://"+u.addr), nil, nil, discardLogger(), settings{appendXFF: true, upstreamTimeout: defaultUpstreamTimeout}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: gw\r\n\r\n")
	<-arrived
	c.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream connection outlived the client by 10 s")
	}
}

// An upstream that does not answer within --upstream-timeout gets its
// connection cut, and the client a 504, as from Envoy's route timeout; one
// whose answer stalls midway gets its connection cut, and so does the
// client; one that answers in time is passed on. Requests with a body take
// net/http's Transport, which the timeout cuts the same way.
func TestGateway_UpstreamTimeout(t *testing.T) {
	for _, body := range []string{"", "payload"} {
		arrived, closed := make(chan struct{}, 2), make(chan struct{}, 2)
		u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader, req *http.Request, _ []byte) bool {
			switch req.URL.Path {
			case "/fast":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			case "/stall":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
			}
			arrived <- struct{}{}
			if _, err := br.ReadByte(); err != nil {
				closed <- struct{}{} // the gateway cut the connection
			}
			return false
		})
		addr := serveGateway(t, newHandler(mustURL(t, "http://"+u.addr), nil, nil, discardLogger(), settings{upstreamTimeout: 200 * time.Millisecond}))
		// status and body, or the error of the request or of reading the body
		post := func(path string) (int, string, error) {
			req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
			res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req) // the test's own bound
			if err != nil {
				return 0, "", err
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			return res.StatusCode, string(b), err
		}
		if code, b, err := post("/fast"); code != 200 || b != "ok" || err != nil {
			t.Errorf("body %q, in time: %d %q %v", body, code, b, err)
		}
		if code, b, err := post("/slow"); code != http.StatusGatewayTimeout || b != "upstream request timeout" || err != nil {
			t.Errorf("body %q, too slow: %d %q %v; want 504", body, code, b, err)
		}
		// The gateway had not sent the head yet, so the client sees its
		// connection end, as it would see it end midway otherwise.
		if code, b, err := post("/stall"); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("body %q, stalled: %d %q %v; want the exchange cut", body, code, b, err)
		}
		for _, path := range []string{"/slow", "/stall"} {
			<-arrived
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatalf("body %q, %s: the upstream connection outlived the timeout by 10 s", body, path)
			}
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The transport sends a request without a body itself, and one with a
// body through net/http's Transport.
func TestDirect(t *testing.T) {
	get := func(mod func(*http.Request)) *http.Request {
		r, _ := http.NewRequest("GET", "http://up:8080/x", nil)
		if mod != nil {
			mod(r)
		}
		return r
	}
	for _, tc := range []struct {
		name string
		req  *http.Request
		want bool
	}{
		{"get", get(nil), true},
		{"https", get(func(r *http.Request) { r.URL.Scheme = "https" }), false},
		{"body", get(func(r *http.Request) { r.Body, r.ContentLength = io.NopCloser(bytes.NewReader([]byte("x"))), 1 }), false},
		{"upgrade", get(func(r *http.Request) { r.Header.Set("Upgrade", "websocket") }), false},
		{"expect", get(func(r *http.Request) { r.Header.Set("Expect", "100-continue") }), false},
		{"bad header", get(func(r *http.Request) { r.Header.Set("X", "a\nb") }), false},
		{"bad method", get(func(r *http.Request) { r.Method = "G T" }), false},
	} {
		if got := direct(tc.req); got != tc.want {
			t.Errorf("%s: direct = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A connection goes back to the pool only after an answer read to its end
// that neither side closed: not after Connection: close, nor after a body
// closed before its end.
func TestUpstreamTransport_KeepsOnlyCleanConnections(t *testing.T) {
	u := startRawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request, _ []byte) bool {
		switch req.URL.Path {
		case "/close":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
		}
		return true
	})
	addr := u.addr
	for _, tc := range []struct {
		path string
		read int // bytes read before Close, -1 all
		idle int
	}{{"/close", -1, 0}, {"/", 4, 0}, {"/", -1, 1}} {
		tr := newUpstreamTransport(0, false, nil)
		req, _ := http.NewRequest("GET", "http://"+addr+tc.path, nil)
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if tc.read < 0 {
			io.ReadAll(res.Body)
		} else {
			io.ReadFull(res.Body, make([]byte, tc.read))
		}
		res.Body.Close()
		if n := tr.pool.Idle(addr); n != tc.idle {
			t.Errorf("%s, %d bytes read: %d idle connections, want %d", tc.path, tc.read, n, tc.idle)
		}
	}
}

// FuzzUpstreamTransport: whatever an upstream answers a GET with, the
// client gets the same bytes through a ReverseProxy with the gateway's
// transport as with net/http's.
func FuzzUpstreamTransport(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3\r\nabc\r\n0\r\nX-T: done\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nto the end",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
		"HTTP/1.1 301 Moved\r\nLocation: /b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	var mu sync.Mutex
	var answer []byte
	reply := func(c net.Conn, _ *bufio.Reader, _ *http.Request, _ []byte) bool {
		mu.Lock()
		a := answer
		mu.Unlock()
		c.Write(a)
		return false
	}
	// One upstream and one proxy for each transport, kept over the inputs;
	// the transports are new for each input (freshTransport).
	var netHTTPTransport, ourTransport freshTransport
	start := func(tr http.RoundTripper) string {
		u := startRawUpstream(f, reply)
		return serveGateway(f, sniffless(testProxy(tr, "http://"+u.addr, nil)))
	}
	netHTTP, ours := start(&netHTTPTransport), start(&ourTransport)
	f.Cleanup(func() {
		netHTTPTransport.set(nil)
		ourTransport.set(nil)
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		mu.Lock()
		answer = data
		mu.Unlock()
		netHTTPTransport.set(wasmhost.NewTransport())
		ourTransport.set(newUpstreamTransport(0, false, nil))
		const get = "GET /f HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n"
		want, got := rawExchange(t, netHTTP, get), rawExchange(t, ours, get)
		if got != want {
			t.Fatalf("upstream answer %q:\n got %q\nwant %q", data, got, want)
		}
	})
}

// freshTransport passes each request to the transport set last. The
// upstream of FuzzUpstreamTransport closes each connection after its
// answer, without saying so; a transport kept from one input to the next
// may send the next request on that connection before it sees the close,
// and what happens then is a race in net/http: a connection whose answer
// had bytes after it ("HTTP/1.1 200\nContent-Length:0\n\n00000Z") went
// back to its idle pool before those bytes were seen, and the next request
// read them as its answer, a 502 (once in about 150,000 inputs; our
// transport does not reuse a connection with bytes waiting). A transport
// made for each input starts on a new connection.
type freshTransport struct {
	mu sync.Mutex
	rt http.RoundTripper
}

// set makes rt the transport, and closes the idle connections of the one
// before it.
func (f *freshTransport) set(rt http.RoundTripper) {
	f.mu.Lock()
	old := f.rt
	f.rt = rt
	f.mu.Unlock()
	switch old := old.(type) {
	case *http.Transport:
		old.CloseIdleConnections()
	case *upstreamTransport:
		old.pool.Close()
		old.fallback.(*http.Transport).CloseIdleConnections()
	}
}

func (f *freshTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	rt := f.rt
	f.mu.Unlock()
	return rt.RoundTrip(req)
}

// An upstream that switches protocols unasked gets 502 sent to the
// client and its connection closed, not left open.
func TestUpstreamTransport_UnaskedSwitchCloses(t *testing.T) {
	closed := make(chan struct{})
	u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader, _ *http.Request, _ []byte) bool {
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
		if _, err := br.ReadByte(); err != nil {
			close(closed)
		}
		return false
	})
	got := through(t, newUpstreamTransport(0, false, nil), u, nil, "GET / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(got[0], "502 ") {
		t.Errorf("the client got %q", got[0])
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's connection is still open 10 s after its unasked 101")
	}
}

// The upstream service time is Envoy's: from the request's end (its body
// read whole) to the answer's headers, replacing the upstream's own value;
// none when the answer came before the body ended, nor when there was no
// answer.
func TestServiceTimed_RoundTrip(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		name     string
		body     string
		readBody bool   // the upstream reads the body before answering
		own      string // the upstream's own x-envoy-upstream-service-time
		fail     bool
		want     []string
	}{
		{name: "no body", want: []string{"12"}},
		{name: "body read", body: "payload", readBody: true, want: []string{"5"}},
		{name: "answer before the body ended", body: "payload", own: "99", want: []string{"99"}},
		{name: "the upstream's own value", own: "99", want: []string{"12"}},
		{name: "no answer", fail: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The clock: the request starts at t0; reading the body takes
			// 7 ms; the answer's headers come at t0 + 12 ms.
			now := t0
			clock := func() time.Time { return now }
			next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if tt.readBody {
					now = now.Add(7 * time.Millisecond)
					if b, err := io.ReadAll(r.Body); err != nil || string(b) != tt.body {
						t.Errorf("body %q %v", b, err)
					}
					now = now.Add(5 * time.Millisecond)
				} else {
					now = now.Add(12 * time.Millisecond)
				}
				if tt.fail {
					return nil, errors.New("refused")
				}
				res := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
				if tt.own != "" {
					res.Header.Set(serviceTimeHeader, tt.own)
				}
				return res, nil
			})
			req, _ := http.NewRequest("POST", "http://up/x", nil)
			if tt.body != "" {
				req, _ = http.NewRequest("POST", "http://up/x", strings.NewReader(tt.body))
			}
			res, err := serviceTimed{next, clock}.RoundTrip(req)
			if tt.fail {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Header[serviceTimeHeader]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s = %q, want %q", serviceTimeHeader, got, tt.want)
			}
		})
	}
}

// Setting the header allocates nothing for a request without a body.
func TestServiceTimed_Allocations(t *testing.T) {
	res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/plain"}, "Date": {"x"}}, Body: http.NoBody}
	st := serviceTimed{roundTripFunc(func(*http.Request) (*http.Response, error) { return res, nil }), time.Now}
	req, _ := http.NewRequest("GET", "http://up/x", nil)
	if n := testing.AllocsPerRun(100, func() { st.RoundTrip(req) }); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A failed exchange with the upstream gets Envoy's router's answer (503
// when the connection ended before the answer, 502 when the answer was
// not HTTP; wasmhost.UpstreamFailure), as gRPC's to a gRPC request, and
// its response flag in the access log.
func TestNewHandler_UpstreamFailures(t *testing.T) {
	u := startRawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request, _ []byte) bool {
		switch req.URL.Path {
		case "/malformed":
			io.WriteString(c, "HTTP/1.1 two hundred\r\n\r\n")
		case "/switch": // a protocol switch nobody asked for
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
		}
		return false // and /close gets nothing
	})
	path := filepath.Join(t.TempDir(), "access.log")
	format, err := accessFormatFrom("%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS%\n", "")
	if err != nil {
		t.Fatal(err)
	}
	alog, err := openAccessLog(path, format, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	h, served := whenServed(newHandler(mustURL(t, "http://"+u.addr), nil, alog, discardLogger(), settings{}))
	addr := serveGateway(t, h)
	const reset = "upstream connect error or disconnect/reset before headers. reset reason: "
	var wantLog []string
	for _, tc := range []struct {
		path, flag string
		status     int
		body       string
	}{
		{"/close", "UC", 503, reset + "connection termination"},
		{"/malformed", "UPE", 502, reset + "protocol error"},
		{"/switch", "UPE", 502, reset + "protocol error"},
	} {
		for _, grpc := range []bool{false, true} {
			req, _ := http.NewRequest("GET", "http://"+addr+tc.path, nil)
			want := fmt.Sprintf("%d text/plain grpc-status= grpc-message= body=%s", tc.status, tc.body)
			if grpc {
				req.Method = "POST"
				req.Body = io.NopCloser(strings.NewReader("\x00\x00\x00\x00\x00"))
				req.Header.Set("Content-Type", "application/grpc")
				want = "200 application/grpc grpc-status=14 grpc-message=" + strings.ReplaceAll(tc.body, "%", "%25") + " body="
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			<-served
			got := fmt.Sprintf("%d %s grpc-status=%s grpc-message=%s body=%s", res.StatusCode, res.Header.Get("Content-Type"),
				res.Header.Get("Grpc-Status"), res.Header.Get("Grpc-Message"), b)
			if got != want {
				t.Errorf("%s (gRPC %v):\n got %s\nwant %s", tc.path, grpc, got, want)
			}
			wantLog = append(wantLog, fmt.Sprintf("%s %d %s", tc.path, res.StatusCode, tc.flag))
		}
	}
	if err := alog.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if got := strings.TrimSuffix(string(data), "\n"); got != strings.Join(wantLog, "\n") {
		t.Errorf("access log:\n%s\nwant:\n%s", got, strings.Join(wantLog, "\n"))
	}
}
