//go:build unix

package idleconn

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// Alive reports whether the idle connection c is still open, without
// blocking: a peek that does not wait finds nothing to read. A closed
// connection reads as the end of the stream, and bytes waiting on an idle
// connection count as dead too: the peer sent them unasked, so they can
// only be an error before a close or a broken stream.
func Alive(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
		return true // never wait for readiness
	})
	return err == nil && alive
}
