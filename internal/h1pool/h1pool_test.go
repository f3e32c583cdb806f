package h1pool

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/idleconn"
	"github.com/sluicehq/sluice/internal/nettest"
)

// server is an HTTP/1.1 server that answers "ok" and counts the
// connections it accepted.
func server(t *testing.T) (*httptest.Server, *atomic.Int64) {
	return nettest.Counting(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
}

// get sends one GET on a connection of p and reads the answer.
func get(t *testing.T, p *Pool, addr string) (reused bool) {
	t.Helper()
	c, err := p.Get(addr, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c.W, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if err := c.W.Flush(); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(c.R, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
	p.Put(c, true)
	return c.Reused
}

// Connections given back are handed out again: no dial per exchange.
func TestPool_Reuse(t *testing.T) {
	srv, conns := server(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	var p Pool
	defer p.Close()
	for i := range 20 {
		if reused := get(t, &p, addr); reused != (i > 0) {
			t.Fatalf("exchange %d: reused %v", i, reused)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 20 exchanges in turn, want 1", n)
	}
	if n := p.Idle(addr); n != 1 {
		t.Errorf("%d idle connections, want 1", n)
	}
}

// A kept-alive connection the server closed while it sat idle is not
// handed out again: the next exchange goes out on a new one.
func TestPool_ServerClosedIdleConnection(t *testing.T) {
	srv, conns := server(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	var p Pool
	defer p.Close()
	get(t, &p, addr)
	srv.CloseClientConnections()
	// The close reaches this side's socket asynchronously; the probe
	// must see it once it has.
	for deadline := time.Now().Add(5 * time.Second); ; {
		p.mu.Lock()
		c := p.idle[addr][0]
		p.mu.Unlock()
		if !idleconn.Alive(c.Conn) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server closed the idle connection 5 s ago and the probe still finds it alive")
		}
		time.Sleep(time.Millisecond)
	}
	if get(t, &p, addr) {
		t.Error("the closed connection was handed out")
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// A connection idle longer than IdleTimeout is closed rather than reused;
// one given back as not reusable is closed at once.
func TestPool_IdleTimeoutAndNotReusable(t *testing.T) {
	srv, conns := server(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := Pool{IdleTimeout: time.Hour}
	defer p.Close()
	get(t, &p, addr)
	p.mu.Lock()
	p.idle[addr][0].idleSince = time.Now().Add(-2 * time.Hour)
	p.mu.Unlock()
	if get(t, &p, addr) {
		t.Error("a connection idle past IdleTimeout was reused")
	}
	c, err := p.Get(addr, time.Time{})
	if err != nil || !c.Reused {
		t.Fatalf("the fresh connection: %v, reused %v", err, c != nil && c.Reused)
	}
	p.Put(c, false)
	if n := p.Idle(addr); n != 0 {
		t.Errorf("%d idle connections after giving back one not reusable, want 0", n)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Error("the connection given back as not reusable is still open")
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// Close ends the connections in use at once, and Get fails after it.
func TestPool_Close(t *testing.T) {
	addr, _ := nettest.Raw(t, func(c net.Conn) { io.Copy(io.Discard, c) }) // reads, never answers
	var p Pool
	c, err := p.Get(addr, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() { _, err := bufio.NewReader(c).ReadByte(); read <- err }()
	p.Close()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("read a byte nobody sent")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read in flight outlived the pool")
	}
	if _, err := p.Get(addr, time.Time{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
}

// LimitReads stops reading from the connection after n bytes, until it is
// lifted.
func TestConn_LimitReads(t *testing.T) {
	addr, _ := nettest.Raw(t, func(c net.Conn) { c.Write([]byte(strings.Repeat("x", 100))) })
	var p Pool
	defer p.Close()
	c, err := p.Get(addr, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c.LimitReads(10)
	b, err := io.ReadAll(c.R)
	if len(b) != 10 || !errors.Is(err, ErrReadLimit) {
		t.Fatalf("read %d bytes (%v), want 10 and the limit", len(b), err)
	}
	c.LimitReads(-1)
	rest, err := io.ReadFull(c.R, make([]byte, 90))
	if rest != 90 || err != nil {
		t.Fatalf("after lifting the limit: %d bytes, %v", rest, err)
	}
}

// An address that is a path is a Unix socket: connections to it are kept
// and reused as TCP ones are, and one the server closed while idle is
// found out before use.
func TestPool_UnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	var p Pool
	defer p.Close()
	for i := range 5 {
		if reused := get(t, &p, sock); reused != (i > 0) {
			t.Fatalf("exchange %d: reused %v", i, reused)
		}
	}
	srv.CloseClientConnections()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		c := p.idle[sock][0]
		p.mu.Unlock()
		if !idleconn.Alive(c.Conn) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server closed the idle connection 5 s ago and the probe still finds it alive")
		}
	}
	if get(t, &p, sock) {
		t.Error("the closed connection was handed out")
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}
