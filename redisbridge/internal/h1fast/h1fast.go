// Package h1fast serves the bridge's check requests on cleartext HTTP/1.1
// connections without net/http.
//
// The check path is the bridge's whole load: one request per proxied HTTP
// request. net/http spends about 27 us of CPU per request here before the
// handler runs (a goroutine for background reads, contexts, header maps),
// as much as the rest of a check. So a small loop reads connections
// itself, answers exactly one request shape,
//
//	POST /v1/rate-limit/check HTTP/1.1 with Content-Length, within 16 KiB,
//
// by calling the bridge's check core (a checkio.Handler, the same one its
// net/http handler calls), and hands the connection to net/http, bytes not
// yet consumed included, the moment it sees anything else: another method
// or path, HTTP/1.0, chunked bodies, Expect, Upgrade, a head or body
// larger than the read buffer. A connection once handed over stays there.
// A connection that opens with the HTTP/2 client preface (h2c with prior
// knowledge) goes to the HTTP/2 server set with ServeH2, when there is one.
package h1fast

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluicehq/sluice/internal/asciifold"
	"github.com/sluicehq/sluice/internal/rawsock"
	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

const (
	bufSize         = 16 << 10 // head + body of a check must fit, else net/http serves it
	readHeadTimeout = 5 * time.Second
	idleTimeout     = 2 * time.Minute
	// writeTimeout bounds writing one answer: a client that stops reading
	// does not hold the connection's goroutine (and a shutdown) forever.
	writeTimeout = 10 * time.Second
)

const checkLine = "POST /v1/rate-limit/check HTTP/1.1\r\n"

// Server is the fast path in front of net/http on one listener.
type Server struct {
	h  checkio.Handler
	h2 func(net.Conn, *bufio.Reader)
	ln net.Listener
	// handoff feeds connections to net/http's Serve.
	handoff *chanListener

	maxAge  time.Duration // SetMaxAge
	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*conn]struct{}
	wg      sync.WaitGroup
}

// New returns a fast path that accepts connections on ln and answers
// checks with h. Serve net/http on Handoff.
func New(ln net.Listener, h checkio.Handler) *Server {
	return &Server{h: h, ln: ln, handoff: newChanListener(ln.Addr()), conns: map[*conn]struct{}{}}
}

// ServeH2 has h2 serve the connections that open with the HTTP/2 client
// preface: c, and r reading it, the preface not consumed. Call it before
// Serve. Shutdown does not end those connections: h2's server does.
func (s *Server) ServeH2(h2 func(c net.Conn, r *bufio.Reader)) { s.h2 = h2 }

// SetMaxAge has the fast path close a connection after its first answer
// once it is about d old (checkio.ConnAge), with Connection: close, so
// that its client opens a new one, possibly to another bridge. Call it
// before Serve; 0, the default, never does.
func (s *Server) SetMaxAge(d time.Duration) { s.maxAge = d }

// Give hands c to net/http (through Handoff) as if accepted; false once
// Handoff is closed.
func (s *Server) Give(c net.Conn) bool { return s.handoff.put(c) }

// Handoff is the listener of the connections the fast path hands over.
// Close it once net/http's Serve on it returned: connections handed over
// from then on are closed.
func (s *Server) Handoff() net.Listener { return s.handoff }

type conn struct {
	c    net.Conn
	r    *bufio.Reader
	old  time.Time // when it is old enough to close (SetMaxAge); zero: never
	idle atomic.Bool
	req  checkio.Request
	resp checkio.Response
	out  []byte
}

// Serve accepts connections until the listener is closed by Shutdown.
func (s *Server) Serve() error {
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			// Like net/http: back off on EMFILE and friends, else give up.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		fc := &conn{c: rawsock.Wrap(c)}
		if s.maxAge > 0 {
			fc.old = time.Now().Add(checkio.ConnAge(s.maxAge))
		}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[fc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(fc)
	}
}

// Shutdown stops accepting, closes idle connections and waits for the
// others to finish their request.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	for fc := range s.conns {
		if fc.idle.Load() {
			// Wakes the reader; it sees closing and closes the connection.
			_ = fc.c.SetReadDeadline(time.Unix(1, 0))
		}
	}
	s.mu.Unlock()
	err := s.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for fc := range s.conns {
			fc.c.Close()
		}
		s.mu.Unlock()
		err = ctx.Err()
	}
	return err
}

func (s *Server) forget(fc *conn) {
	s.mu.Lock()
	delete(s.conns, fc)
	s.mu.Unlock()
	s.wg.Done()
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufSize) }}

// checkHead is what the fast path needs from a request head.
type checkHead struct {
	n             int // bytes of the head, blank line included
	contentLength int
	close         bool
	requestID     []byte
	auth          []byte
}

func (s *Server) serveConn(fc *conn) {
	defer s.forget(fc)
	fc.r = readerPool.Get().(*bufio.Reader)
	fc.r.Reset(fc.c)
	for first := true; ; first = false {
		// In this order: a shutdown that finds the connection idle sets a
		// deadline in the past after ours, or we see closing here.
		fc.idle.Store(true)
		_ = fc.c.SetReadDeadline(time.Now().Add(idleTimeout))
		if s.closing.Load() {
			break
		}
		if _, err := fc.r.Peek(1); err != nil {
			break
		}
		fc.idle.Store(false)
		if first && s.h2 != nil {
			if h2, err := peekPreface(fc); err != nil {
				break
			} else if h2 {
				_ = fc.c.SetReadDeadline(time.Time{})
				s.h2(fc.c, fc.r)
				break
			}
		}
		head, ok, err := peekHead(fc)
		if err != nil {
			break
		}
		if !fc.old.IsZero() && time.Now().After(fc.old) {
			head.close = true
		}
		if ok {
			if ok, err = s.answer(fc, &head); err != nil {
				break
			}
		}
		if !ok {
			s.handOver(fc)
			return
		}
		if head.close {
			break
		}
	}
	fc.c.Close()
	fc.r.Reset(nil)
	readerPool.Put(fc.r)
}

// peekPreface reports whether the connection opens with the HTTP/2
// client preface, without consuming it.
func peekPreface(fc *conn) (bool, error) {
	deadline := false
	for {
		buf, _ := fc.r.Peek(fc.r.Buffered())
		n := min(len(buf), len(http2.ClientPreface))
		if string(buf[:n]) != http2.ClientPreface[:n] {
			return false, nil
		}
		if n == len(http2.ClientPreface) {
			return true, nil
		}
		if !deadline {
			_ = fc.c.SetReadDeadline(time.Now().Add(readHeadTimeout))
			deadline = true
		}
		if _, err := fc.r.Peek(len(buf) + 1); err != nil {
			return false, err
		}
	}
}

// handOver gives the connection, with whatever is buffered, to net/http.
func (s *Server) handOver(fc *conn) {
	_ = fc.c.SetReadDeadline(time.Time{}) // net/http sets its own
	c := &bufferedConn{Conn: fc.c, r: fc.r}
	if !s.handoff.put(c) {
		fc.c.Close()
	}
}

// peekHead waits for a whole request head and parses it without consuming
// it. ok is false when the request is not one the fast path answers.
func peekHead(fc *conn) (checkHead, bool, error) {
	var head checkHead
	deadline := false
	for {
		buf, _ := fc.r.Peek(fc.r.Buffered())
		if i := bytes.Index(buf, []byte("\r\n\r\n")); i >= 0 {
			head.n = i + 4
			return head, parseHead(buf[:head.n], &head), nil
		}
		if len(buf) < len(checkLine) && !bytes.HasPrefix([]byte(checkLine), buf) ||
			len(buf) >= len(checkLine) && !bytes.HasPrefix(buf, []byte(checkLine)) {
			return head, false, nil // not a check: net/http reads the rest
		}
		if len(buf) == bufSize {
			return head, false, nil
		}
		if !deadline {
			_ = fc.c.SetReadDeadline(time.Now().Add(readHeadTimeout))
			deadline = true
		}
		if _, err := fc.r.Peek(len(buf) + 1); err != nil {
			return head, false, err
		}
	}
}

// parseHead accepts only heads it fully understands; for anything else
// net/http decides (and answers 400 where the head is malformed).
func parseHead(b []byte, head *checkHead) bool {
	if !bytes.HasPrefix(b, []byte(checkLine)) {
		return false
	}
	b = b[len(checkLine) : len(b)-2]
	head.contentLength = -1
	host := false
	for len(b) > 0 {
		i := bytes.Index(b, []byte("\r\n"))
		line := b[:i]
		b = b[i+2:]
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return false
		}
		name, val := line[:colon], trimOWS(line[colon+1:])
		for _, c := range name {
			if !isTokenByte(c) {
				return false
			}
		}
		for _, c := range val {
			if c < 0x20 && c != '\t' || c == 0x7f {
				return false
			}
		}
		switch {
		case asciifold.EqualLower(name, "content-length"):
			if head.contentLength >= 0 || len(val) == 0 || len(val) > 6 {
				return false
			}
			n := 0
			for _, c := range val {
				if c < '0' || c > '9' {
					return false
				}
				n = n*10 + int(c-'0')
			}
			head.contentLength = n
		case asciifold.EqualLower(name, "host"):
			if host {
				return false
			}
			host = true
		case asciifold.EqualLower(name, "connection"):
			switch {
			case asciifold.EqualLower(val, "close"):
				head.close = true
			case asciifold.EqualLower(val, "keep-alive"):
			default:
				return false
			}
		case asciifold.EqualLower(name, "x-request-id"):
			if head.requestID == nil {
				head.requestID = val
			}
		case asciifold.EqualLower(name, "authorization"):
			if head.auth != nil {
				return false
			}
			head.auth = val
		case asciifold.EqualLower(name, "transfer-encoding"), asciifold.EqualLower(name, "expect"),
			asciifold.EqualLower(name, "upgrade"), asciifold.EqualLower(name, "trailer"):
			return false
		}
	}
	return host && head.contentLength >= 0
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// answer reads the body of a check whose head is parsed, has the handler
// answer it and writes the answer. It returns false, having consumed
// nothing, when the request is too large for the buffer.
func (s *Server) answer(fc *conn, head *checkHead) (bool, error) {
	total := head.n + head.contentLength
	if total > bufSize {
		return false, nil
	}
	raw, err := fc.r.Peek(total)
	if err != nil {
		return false, err
	}
	fc.req = checkio.Request{Authorization: head.auth, RequestID: head.requestID, Body: raw[head.n:]}
	fc.resp.Reset()
	s.h.ServeCheck(context.Background(), &fc.req, &fc.resp)
	fc.req = checkio.Request{}
	_, _ = fc.r.Discard(total)
	fc.out = appendResponse(fc.out[:0], &fc.resp, head.close)
	_ = fc.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err = fc.c.Write(fc.out)
	return true, err
}

// appendResponse writes a whole answer: status line, the handler's
// headers, Date, Connection when closing, Content-Length, body.
func appendResponse(b []byte, r *checkio.Response, close bool) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(r.Status)...)
	b = append(b, "\r\n"...)
	for _, h := range r.Headers {
		b = append(b, h.Name...)
		b = append(b, ": "...)
		b = append(b, h.Value...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Date: "...)
	b = append(b, checkio.Date()...)
	b = append(b, "\r\n"...)
	if close {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(r.Body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, r.Body...)
}

// bufferedConn is a connection whose first bytes sit in r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

// CloseWrite lets net/http half-close as it does on a *net.TCPConn.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// chanListener is the listener net/http serves: connections handed over.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) put(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
