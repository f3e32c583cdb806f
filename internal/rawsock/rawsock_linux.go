//go:build linux

package rawsock

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// conn is a stream socket read and written by raw system calls, a side
// for each direction.
type conn struct {
	net.Conn
	rc   syscall.RawConn
	r, w side
}

// side is one direction of a conn. The buffer of its call and the call's
// result are kept here, and the functions syscall.RawConn takes are made
// once, so that a call allocates nothing; the mutex keeps two concurrent
// calls of one direction, which net.Conn allows, apart.
type side struct {
	mu    sync.Mutex
	op    string // "read" or "write"
	buf   []byte
	n     int
	errno syscall.Errno
	// wait is the RawConn's Read or Write, which calls step until it
	// returns true, waiting for the socket to be ready in between.
	wait func(func(uintptr) bool) error
	step func(uintptr) bool
}

func wrap(c net.Conn, rc syscall.RawConn) net.Conn {
	w := &conn{Conn: c, rc: rc}
	w.r = side{op: "read", wait: rc.Read}
	w.r.step = w.r.readOnce
	w.w = side{op: "write", wait: rc.Write}
	w.w.step = w.w.writeAll
	return w
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.r.do(c, p)
	if err == nil && n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, err
}

func (c *conn) Write(p []byte) (int, error) { return c.w.do(c, p) }

// do makes s's system call on p through the poller; n is how much of p
// it read or wrote.
func (s *side) do(c *conn, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	s.buf, s.n, s.errno = p, 0, 0
	err := s.wait(s.step)
	n, errno := s.n, s.errno
	s.buf = nil
	s.mu.Unlock()
	if err == nil && errno != 0 {
		err = os.NewSyscallError(s.op, errno)
	}
	if err != nil {
		return n, c.opError(s.op, err)
	}
	return n, nil
}

// readOnce reads once into buf; false: nothing to read yet, wait.
func (s *side) readOnce(fd uintptr) bool {
	n, e := call(syscall.SYS_READ, fd, s.buf)
	if e == syscall.EAGAIN {
		return false
	}
	if e != 0 {
		s.errno = e
	} else {
		s.n = n
	}
	return true
}

// writeAll writes what is left of buf; false: the socket's buffer is
// full, wait until it takes more.
func (s *side) writeAll(fd uintptr) bool {
	for s.n < len(s.buf) {
		n, e := call(syscall.SYS_WRITE, fd, s.buf[s.n:])
		switch e {
		case 0:
			s.n += n
		case syscall.EAGAIN:
			return false
		default:
			s.errno = e
			return true
		}
	}
	return true
}

// call makes read(2) or write(2) (trap) of b on fd, again when a signal
// interrupted it.
func call(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

// opError reports err as net.Conn's Read and Write do: a *net.OpError
// naming the operation and both addresses. syscall.RawConn's own errors
// (a deadline, a closed connection) come as one already, named
// "raw-read" or "raw-write".
func (c *conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// SyscallConn is the socket's, for what looks at it (idleconn).
func (c *conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }

// CloseWrite half-closes the socket, as *net.TCPConn and *net.UnixConn do.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
