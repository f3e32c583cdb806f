//go:build linux || darwin || freebsd

package wasmhost

import (
	"net"
	"syscall"
)

// aliveIdle reports whether an idle connection is still open: a peek that
// does not wait finds nothing to read. A closed connection reads as the end
// of the stream; anything else the server sent on an idle connection is
// not an answer to a request, and the connection is not reused either.
func aliveIdle(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait for the poller
	})
	return err == nil && alive
}
