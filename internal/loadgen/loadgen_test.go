package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseResponse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		status   int
		body     string
		ok       bool
	}{
		{"ok", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: y\r\n\r\nhi", 200, "hi", true},
		{"lower case", "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\r\n", 429, "", true},
		{"no reason", "HTTP/1.1 503\r\nContent-Length: 1\r\n\r\nx", 503, "x", true},
		{"no length", "HTTP/1.1 200 OK\r\n\r\n", 0, "", false},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 0, "", false},
		{"negative length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "", false},
		{"bad status", "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", 0, "", false},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// What follows the answer (the next one) is not its.
			in := tc.in + "HTTP/1.1 200"
			a, err := parseResponse([]byte(in))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			if a.size != len(tc.in) || a.status != tc.status || string(a.body) != tc.body {
				t.Fatalf("got size %d, %d %q, want %d, %d %q", a.size, a.status, a.body, len(tc.in), tc.status, tc.body)
			}
			// Every beginning of it is an answer not all there yet.
			for n := range len(tc.in) {
				if a, err := parseResponse([]byte(tc.in[:n])); err != nil || a.size != 0 {
					t.Fatalf("the first %d bytes: size %d, %v; want 0 and no error", n, a.size, err)
				}
			}
		})
	}
}

func TestRun(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		served.Add(1)
		w.Write(b) // echo
	}))
	defer srv.Close()
	bodies := [][]byte{[]byte("a"), []byte("bb")}
	var seen atomic.Int64
	res, err := Run(context.Background(), Options{
		Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/x", Bodies: bodies, Conns: 4, N: 100,
		Check: func(status int, body []byte) error {
			if status == 200 && (string(body) == "a" || string(body) == "bb") {
				seen.Add(1)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 100 || len(res.Latencies) != 100 || served.Load() != 100 || seen.Load() != 100 || res.Rate() <= 0 {
		t.Fatalf("N %d, latencies %d, served %d, echoed %d", res.N, len(res.Latencies), served.Load(), seen.Load())
	}
	if res.Percentile(0.99) < res.Percentile(0.5) {
		t.Fatal("latencies not sorted")
	}
	if _, err := Run(context.Background(), Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/x", Bodies: bodies, Conns: 2, N: 10,
		Check: func(status int, body []byte) error { return io.ErrUnexpectedEOF }}); err == nil {
		t.Fatal("a failing Check did not stop the run")
	}
}

// TestRun_LargeBodies: a request larger than the socket's buffers goes
// out in parts as the server reads it, and an answer larger than the
// read buffer is read whole.
func TestRun_LargeBodies(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b) // echo
	}))
	defer srv.Close()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	big[len(big)-1] = '!'
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var echoed atomic.Int64
	res, err := Run(ctx, Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/x", Bodies: [][]byte{big}, Conns: 2, N: 4,
		Check: func(status int, body []byte) error {
			if status != 200 || !bytes.Equal(body, big) {
				return fmt.Errorf("status %d, %d bytes echoed of %d", status, len(body), len(big))
			}
			echoed.Add(1)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 4 || echoed.Load() != 4 {
		t.Fatalf("N %d, echoed %d", res.N, echoed.Load())
	}
}

// TestRun_H2C: over h2c, many streams share few connections, and every
// answer is judged.
func TestRun_H2C(t *testing.T) {
	var served, conns, inFlight, maxInFlight atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
		}
		if r.ProtoMajor != 2 {
			t.Errorf("request over %s", r.Proto)
		}
		b, _ := io.ReadAll(r.Body)
		served.Add(1)
		w.Write(b)
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	bodies := [][]byte{[]byte("a"), bytes.Repeat([]byte("b"), 40_000)} // the second spans frames
	var seen atomic.Int64
	res, err := Run(context.Background(), Options{
		Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/x", Bodies: bodies, Conns: 2, Streams: 16, N: 400, H2C: true,
		Check: func(status int, body []byte) error {
			if status == 200 && (string(body) == "a" || bytes.Equal(body, bodies[1])) {
				seen.Add(1)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 400 || served.Load() != 400 || seen.Load() != 400 || conns.Load() != 2 {
		t.Fatalf("N %d, served %d, echoed %d, connections %d", res.N, served.Load(), seen.Load(), conns.Load())
	}
	if maxInFlight.Load() < 2 {
		t.Fatalf("at most %d requests in flight: the streams did not overlap", maxInFlight.Load())
	}
}

// TestRun_ConnHeaders: without bodies the requests are GETs, and each
// connection sends its own header on every request. The server holds
// the first two requests until both are in, so they are on the two
// connections; later ones land wherever, each with its connection's user.
func TestRun_ConnHeaders(t *testing.T) {
	var mu sync.Mutex
	users := map[string]map[string]int{} // by peer: the user header values it sent
	var first []string                   // the users of the first two requests
	both := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "GET" || r.ContentLength != 0 {
			t.Errorf("%s with %d bytes of body", r.Method, r.ContentLength)
		}
		u := r.Header.Get("X-User-Id")
		mu.Lock()
		if users[r.RemoteAddr] == nil {
			users[r.RemoteAddr] = map[string]int{}
		}
		users[r.RemoteAddr][u]++
		wait := len(first) < 2
		if wait {
			if first = append(first, u); len(first) == 2 {
				close(both)
			}
		}
		mu.Unlock()
		if wait {
			<-both
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/api",
		ConnHeaders: []string{"X-User-Id: a\r\n", "X-User-Id: b\r\n"}, Conns: 2, N: 100})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 100 {
		t.Fatalf("N %d", res.N)
	}
	slices.Sort(first)
	if !slices.Equal(first, []string{"a", "b"}) {
		t.Errorf("the two connections sent users %v, want a and b", first)
	}
	for peer, seen := range users {
		if len(seen) != 1 {
			t.Errorf("connection %s sent users %v, want one", peer, seen)
		}
	}
}

// TestRun_Paced: at a rate, no request goes out before it is due, so a
// run of n takes at least (n-1)/rate however fast the server answers.
func TestRun_Paced(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
	}))
	defer srv.Close()
	const n, rate = 60, 400.0
	start := time.Now()
	res, err := Run(context.Background(), Options{Addr: strings.TrimPrefix(srv.URL, "http://"), Path: "/", Conns: 8, N: n, Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != n {
		t.Fatalf("N %d", res.N)
	}
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	for i, at := range arrivals {
		if due := start.Add(time.Duration(float64(i) * float64(time.Second) / rate)); at.Before(due) {
			t.Fatalf("request %d arrived %v before it was due", i, due.Sub(at))
		}
	}
	if _, err := Run(context.Background(), Options{Addr: "127.0.0.1:1", Bodies: [][]byte{{'x'}}, Conns: 1, N: 1, H2C: true, Rate: 1}); err == nil {
		t.Fatal("h2c with a rate was accepted")
	}
}
