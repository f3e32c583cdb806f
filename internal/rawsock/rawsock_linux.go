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

// conn is a stream socket read and written by raw system calls. Each
// direction keeps the buffer of its call in the struct and a method value
// made once, so that neither allocates; its mutex keeps two concurrent
// calls of the same direction from sharing those fields, as net.Conn
// allows them.
type conn struct {
	net.Conn
	rc syscall.RawConn

	rmu    sync.Mutex
	rbuf   []byte
	rn     int
	rerrno syscall.Errno
	readFD func(uintptr) bool

	wmu     sync.Mutex
	wbuf    []byte
	wn      int
	werrno  syscall.Errno
	writeFD func(uintptr) bool
}

func wrap(c net.Conn, rc syscall.RawConn) net.Conn {
	w := &conn{Conn: c, rc: rc}
	w.readFD, w.writeFD = w.readOnce, w.writeAll
	return w
}

func (c *conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	c.rbuf, c.rn, c.rerrno = p, 0, 0
	err := c.rc.Read(c.readFD)
	n, errno := c.rn, c.rerrno
	c.rbuf = nil
	c.rmu.Unlock()
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readOnce reads once into rbuf; false: nothing to read yet, wait.
func (c *conn) readOnce(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(c.rbuf))), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn = int(n)
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.rerrno = e
			return true
		}
	}
}

func (c *conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wmu.Lock()
	c.wbuf, c.wn, c.werrno = p, 0, 0
	err := c.rc.Write(c.writeFD)
	n, errno := c.wn, c.werrno
	c.wbuf = nil
	c.wmu.Unlock()
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// writeAll writes what is left of wbuf; false: the socket's buffer is
// full, wait until it takes more.
func (c *conn) writeAll(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		rest := c.wbuf[c.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(rest))), uintptr(len(rest)))
		switch e {
		case 0:
			c.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werrno = e
			return true
		}
	}
	return true
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
