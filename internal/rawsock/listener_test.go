package rawsock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/rawsock"
)

// TestListener serves net/http on a wrapped listener: kept-alive requests,
// a hijacked connection, and Accept after Close.
func TestListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wrapped := make(chan bool, 8)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello "+r.URL.Path)
	})
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		rw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		rw.Flush()
	})
	srv := &http.Server{Handler: mux, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		_, plain := c.(*net.TCPConn)
		wrapped <- !plain
		return ctx
	}}
	l := rawsock.Listener(ln)
	if l.Addr() != ln.Addr() {
		t.Errorf("Addr: %v, want %v", l.Addr(), ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer srv.Close()

	url := "http://" + ln.Addr().String()
	var reused []bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
	client := &http.Client{Transport: &http.Transport{}}
	for _, path := range []string{"/a", "/b", "/hijack"} {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", url+path, nil)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		want := "hello " + path
		if path == "/hijack" {
			want = "hijacked"
		}
		if err != nil || string(body) != want {
			t.Fatalf("%s: %q, %v; want %q", path, body, err, want)
		}
	}
	if want := []bool{false, true, true}; len(reused) != 3 || reused[0] != want[0] || reused[1] != want[1] || reused[2] != want[2] {
		t.Errorf("connections reused: %v, want %v", reused, want)
	}
	if got, want := <-wrapped, runtime.GOOS == "linux"; got != want {
		t.Errorf("the accepted connection wrapped: %v, want %v", got, want)
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve after Close: %v, want net.ErrClosed", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// TestDialContext: the connections a dial makes come back wrapped, its
// errors unchanged, and an http.Transport dialing through it speaks HTTPS
// and HTTP/1.1 as before.
func TestDialContext(t *testing.T) {
	var d net.Dialer
	var dialed []net.Conn
	dial := rawsock.DialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			dialed = append(dialed, c)
		}
		return c, err
	})
	refused := errors.New("refused")
	if c, err := rawsock.DialContext(func(context.Context, string, string) (net.Conn, error) { return nil, refused })(context.Background(), "tcp", "x:1"); c != nil || err != refused {
		t.Errorf("a failed dial: %v, %v; want nil, %v", c, err, refused)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Proto) })
	for _, srv := range []*httptest.Server{httptest.NewServer(hello), httptest.NewTLSServer(hello)} {
		defer srv.Close()
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.DialContext = dial
		dialed = nil
		for range 2 {
			res, err := (&http.Client{Transport: tr}).Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil || string(body) != "hello HTTP/1.1" {
				t.Fatalf("%s: %q, %v", srv.URL, body, err)
			}
		}
		if len(dialed) != 1 {
			t.Errorf("%s: %d connections dialed for two requests, want 1", srv.URL, len(dialed))
		}
		tr.CloseIdleConnections()
	}
	srv := httptest.NewServer(hello)
	defer srv.Close()
	c, err := dial(context.Background(), "tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, plain := c.(*net.TCPConn); plain == (runtime.GOOS == "linux") {
		t.Errorf("dialed a %T; wrapped on Linux only", c)
	}
}
