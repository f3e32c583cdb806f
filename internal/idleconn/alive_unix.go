//go:build unix

package idleconn

import (
	"crypto/tls"
	"net"
	"syscall"
)

// Probe looks at one connection, as Alive does, without allocating: a
// pool probes every connection it hands out again.
type Probe struct {
	rc    syscall.RawConn // nil: nothing to look at
	err   error           // from SyscallConn
	alive bool
	peek  func(fd uintptr) bool
}

// NewProbe returns a probe of c.
func NewProbe(c net.Conn) *Probe {
	p := &Probe{}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if sc, ok := c.(syscall.Conn); ok {
		p.rc, p.err = sc.SyscallConn()
		p.peek = p.peekFD
	}
	return p
}

// Alive reports whether the idle connection is still open, without
// blocking: a peek that does not wait finds nothing to read. A closed
// connection reads as the end of the stream, and bytes waiting on an idle
// connection count as dead too: the peer sent them unasked, so they can
// only be an error before a close or a broken stream.
func (p *Probe) Alive() bool {
	switch {
	case p.err != nil:
		return false
	case p.rc == nil:
		return true
	}
	p.alive = false
	err := p.rc.Read(p.peek)
	return err == nil && p.alive
}

func (p *Probe) peekFD(fd uintptr) bool {
	p.alive = nothingToRead(fd)
	return true // never wait for readiness
}

// Alive reports whether the idle connection c is still open (Probe.Alive).
func Alive(c net.Conn) bool { return NewProbe(c).Alive() }
