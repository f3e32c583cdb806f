// Package h1pool keeps HTTP/1.1 connections alive between exchanges, for
// clients that write a request and read its answer on the goroutine that
// asked: a caller takes a connection, uses it, and gives it back. net/http's
// Transport hands each exchange to a reader and a writer goroutine of the
// connection instead, and in a proxy that waits for every answer those
// hand-offs (each a wake-up of another thread when the CPUs are idle)
// cost more than the exchange. The host's call-outs (wasmhost) and the
// gateway's requests to its upstream share this pool.
//
// A connection the server closed while it sat idle is not handed out
// again: it is probed before reuse (idleconn.Probe), as Envoy's connection
// pool notices a remote close on an idle connection, rather than found
// dead after a request was written on it.
package h1pool

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/idleconn"
	"github.com/sluicehq/sluice/internal/rawsock"
)

// ErrClosed: the pool is closed.
var ErrClosed = errors.New("h1pool: pool closed")

// Pool is a set of kept-alive connections by address. The zero value is
// ready to use; a Pool must not be copied after first use.
type Pool struct {
	// MaxIdle bounds the idle connections kept per address; 0 means 1024,
	// enough for a busy proxy never to dial in steady state.
	MaxIdle int
	// IdleTimeout closes a connection that sat idle longer, rather than
	// reuse it: servers close theirs after a while, and a connection
	// taken just as the server gives up on it fails the request written
	// on it. 0 keeps them however long they idle.
	IdleTimeout time.Duration
	// DialTimeout bounds a dial when the caller gives no earlier deadline;
	// 0: none.
	DialTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*Conn // by address, most recently used last
	busy   map[*Conn]struct{} // in use, closed by Close
	closed bool
}

// Conn is a connection of a pool, with its buffers.
type Conn struct {
	net.Conn
	R *bufio.Reader // reads through the limit of LimitReads
	W *bufio.Writer
	// Reused: the connection carried an exchange before this one.
	Reused bool

	addr      string
	probe     *idleconn.Probe
	idleSince time.Time
	left      int64 // bytes R may still read from the connection; < 0: no limit
}

// ErrReadLimit: more was read from a connection than LimitReads allowed.
var ErrReadLimit = errors.New("h1pool: read limit exceeded")

// LimitReads bounds what R reads from the connection from now on to n
// bytes (n < 0: no bound), so that a server cannot make a caller that
// reads an answer's head buffer without end: a bufio.Reader grows no
// further than its size, but textproto keeps every header line.
func (c *Conn) LimitReads(n int64) { c.left = n }

// connReader is what R reads: the connection, within its limit.
type connReader struct{ c *Conn }

func (r connReader) Read(p []byte) (int, error) {
	c := r.c
	if c.left == 0 {
		return 0, ErrReadLimit
	}
	if c.left > 0 && int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	if c.left > 0 {
		c.left -= int64(n)
	}
	return n, err
}

// Get returns an idle connection to addr that is still open, or dials a
// new one by deadline (zero: none but DialTimeout). addr is "host:port",
// or the path of a Unix socket ("/run/sluice/bridge.sock"): a proxy and a
// bridge on one machine skip the TCP stack on both sides.
func (p *Pool) Get(addr string, deadline time.Time) (*Conn, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		list := p.idle[addr]
		if len(list) == 0 {
			break
		}
		c := list[len(list)-1]
		list[len(list)-1] = nil
		p.idle[addr] = list[:len(list)-1]
		p.mu.Unlock()
		fresh := p.IdleTimeout <= 0 || time.Since(c.idleSince) < p.IdleTimeout
		if fresh && c.R.Buffered() == 0 && c.probe.Alive() {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				c.Conn.Close()
				return nil, ErrClosed
			}
			p.busyAdd(c)
			p.mu.Unlock()
			c.Reused, c.left = true, -1
			return c, nil
		}
		c.Conn.Close()
		p.mu.Lock()
	}
	p.mu.Unlock()
	d := net.Dialer{Deadline: deadline, Timeout: p.DialTimeout}
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	nc, err := d.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	nc = rawsock.Wrap(nc)
	c := &Conn{Conn: nc, addr: addr, W: bufio.NewWriter(nc), left: -1, probe: idleconn.NewProbe(nc)}
	c.R = bufio.NewReader(connReader{c})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil, ErrClosed
	}
	p.busyAdd(c)
	return c, nil
}

func (p *Pool) busyAdd(c *Conn) {
	if p.busy == nil {
		p.busy = map[*Conn]struct{}{}
	}
	p.busy[c] = struct{}{}
}

// Put ends a use of c: kept for the next exchange when reusable (the
// exchange ended cleanly, with nothing unread and no close asked), closed
// otherwise.
func (p *Pool) Put(c *Conn, reusable bool) {
	limit := p.MaxIdle
	if limit <= 0 {
		limit = 1024
	}
	p.mu.Lock()
	delete(p.busy, c)
	if reusable && !p.closed && len(p.idle[c.addr]) < limit && c.Conn.SetDeadline(time.Time{}) == nil {
		if p.idle == nil {
			p.idle = map[string][]*Conn{}
		}
		if p.IdleTimeout > 0 {
			c.idleSince = time.Now()
		}
		p.idle[c.addr] = append(p.idle[c.addr], c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.Conn.Close()
}

// Close closes every connection, those in use included: exchanges in
// flight fail at once rather than at their deadline. Get fails from then
// on.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for c := range p.busy {
		c.Conn.Close()
	}
	for _, list := range p.idle {
		for _, c := range list {
			c.Conn.Close()
		}
	}
	p.idle = nil
}

// Idle returns how many idle connections the pool keeps for addr.
func (p *Pool) Idle(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[addr])
}
