// Package nettest holds the loopback servers the tests of the project's
// HTTP/1.1 clients share (internal/h1pool, the wasm host's call-outs, the
// gateway's upstream transport). Each counts the connections it accepted:
// whether a client kept its connection alive is what those tests check.
package nettest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Counting starts an httptest server of h, closed with tb, and counts the
// connections it accepts.
func Counting(tb testing.TB, h http.Handler) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	return srv, &conns
}

// Raw listens on a loopback port until tb ends and serves each connection
// it accepts with serve, on a goroutine of its own, closing the connection
// when serve returns: for answers net/http's server would not write. It
// returns the address and the count of connections accepted.
func Raw(tb testing.TB, serve func(net.Conn)) (addr string, conns *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String(), conns
}

// FreeAddr is a loopback address no one listens on at the moment: for a
// server the test starts later, as its own process or by its own flags.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return FreeAddrs(tb, 1)[0]
}

// FreeAddrs is n such addresses, all different: the kernel may hand a
// port that was just closed out again, so FreeAddr called twice can give
// one port twice, and a server told to listen on both then serves one.
func FreeAddrs(tb testing.TB, n int) []string {
	tb.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close() // held until all are picked
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// Pair returns the two ends of a loopback TCP connection, both closed
// when tb ends.
func Pair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	if server = <-accepted; server == nil {
		tb.Fatal("nettest: accept failed")
	}
	tb.Cleanup(func() { server.Close() })
	return client, server
}
