//go:build unix

package store

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// connAlive tells whether an idle connection is still open, without
// blocking: Redis (its timeout setting) or something between may have
// closed it meanwhile. Bytes waiting on an idle connection count as dead
// too: Redis sends nothing unasked, so they can only be an error before a
// close, or a broken stream.
func connAlive(c net.Conn) bool {
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
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		_ = n // 0: closed; more: bytes nobody asked for
		alive = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
		return true // never wait for readiness
	})
	return err == nil && alive
}
