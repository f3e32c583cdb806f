// Package rawsock reads and writes stream sockets without telling Go's
// runtime that a system call may block.
//
// Every read and write of a net.Conn goes through the runtime's
// entersyscall and exitsyscall, which assume the call may block: when the
// process was idle a moment before, entering one wakes the runtime's
// monitor thread (sysmon) from its deep sleep, and a call that lasts more
// than a monitor tick (20 µs) while the other CPUs are busy has its
// scheduler slot handed to another thread. A socket the net package opened
// is non-blocking, so its reads and writes never wait: they return what
// there is, or EAGAIN, and the net package's poller waits for readiness.
// A service that answers each request with one read and one write of a
// loopback socket paid for those wakes and hand-offs on every request
// (docs/performance.md). Wrap returns a connection whose Read and Write
// make the same system calls as raw ones, through syscall.RawConn, so
// deadlines, closing and the poller behave as before.
package rawsock

import (
	"context"
	"net"
	"syscall"
)

// Wrap returns c reading and writing by raw system calls when it is a TCP
// or Unix stream socket on Linux, and c itself otherwise. The connection
// returned still offers SyscallConn and CloseWrite where c does.
func Wrap(c net.Conn) net.Conn {
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return c
	}
	return wrap(c, rc)
}

// Listener returns ln with every connection it accepts wrapped by Wrap:
// what a server on net/http takes to read and write its clients' sockets
// by raw system calls.
func Listener(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// DialContext returns dial with every connection it makes wrapped by
// Wrap: what an http.Transport's DialContext takes to read and write its
// connections by raw system calls, beneath its TLS too.
func DialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
