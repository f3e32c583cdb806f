package redisbridge

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// The check path is the bridge's whole load: one request per proxied HTTP
// request. net/http spends about 27 us of CPU per request here before the
// handler runs (a goroutine for background reads, contexts, header maps),
// as much as the rest of a check. So cleartext HTTP/1.1 connections are
// served by a small loop that answers exactly one request shape itself,
//
//	POST /v1/rate-limit/check HTTP/1.1 with Content-Length and a valid body,
//
// and hands the connection to net/http, bytes not yet consumed included,
// the moment it sees anything else: another method or path, HTTP/1.0 or
// h2c, chunked bodies, Expect, Upgrade, a bad or missing token, a body the
// wire decoder refuses, a head or body larger than the read buffer. Every
// answer but a successful check or a store failure therefore comes from
// the same net/http handler as before, and a connection once handed over
// stays there.

const (
	fastBufSize     = 16 << 10 // head + body of a check must fit, else net/http serves it
	readHeadTimeout = 5 * time.Second
	idleTimeout     = 2 * time.Minute
)

const checkLine = "POST /v1/rate-limit/check HTTP/1.1\r\n"

// http1 owns the listener of a cleartext bridge.
type http1 struct {
	s  *Server
	ln net.Listener
	// handoff feeds connections to net/http's Serve.
	handoff *chanListener

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*fastConn]struct{}
	wg      sync.WaitGroup
}

type fastConn struct {
	c    net.Conn
	r    *bufio.Reader
	idle atomic.Bool
}

// serve accepts connections until the listener is closed.
func (h *http1) serve() error {
	var delay time.Duration
	for {
		c, err := h.ln.Accept()
		if err != nil {
			if h.closing.Load() {
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
		fc := &fastConn{c: c}
		h.mu.Lock()
		if h.closing.Load() {
			h.mu.Unlock()
			c.Close()
			return nil
		}
		h.conns[fc] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go h.serveConn(fc)
	}
}

// shutdown stops accepting, closes idle connections and waits for the
// others to finish their request.
func (h *http1) shutdown(ctx context.Context) error {
	h.mu.Lock()
	h.closing.Store(true)
	for fc := range h.conns {
		if fc.idle.Load() {
			// Wakes the reader; it sees closing and closes the connection.
			_ = fc.c.SetReadDeadline(time.Unix(1, 0))
		}
	}
	h.mu.Unlock()
	err := h.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		h.mu.Lock()
		for fc := range h.conns {
			fc.c.Close()
		}
		h.mu.Unlock()
		return ctx.Err()
	}
}

func (h *http1) forget(fc *fastConn) {
	h.mu.Lock()
	delete(h.conns, fc)
	h.mu.Unlock()
	h.wg.Done()
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, fastBufSize) }}

// checkHead is what the fast path needs from a request head.
type checkHead struct {
	n             int // bytes of the head, blank line included
	contentLength int
	close         bool
	requestID     []byte
	auth          []byte
}

func (h *http1) serveConn(fc *fastConn) {
	defer h.forget(fc)
	fc.r = readerPool.Get().(*bufio.Reader)
	fc.r.Reset(fc.c)
	out := &outBufs{head: make([]byte, 0, 1024), body: make([]byte, 0, 512)}
	var resp rules.CheckResponse
	for {
		// In this order: a shutdown that finds the connection idle sets a
		// deadline in the past after ours, or we see closing here.
		fc.idle.Store(true)
		_ = fc.c.SetReadDeadline(time.Now().Add(idleTimeout))
		if h.closing.Load() {
			break
		}
		if _, err := fc.r.Peek(1); err != nil {
			break
		}
		fc.idle.Store(false)
		head, ok, err := peekHead(fc)
		if err != nil {
			break
		}
		if ok {
			if ok, err = h.s.fastCheck(fc, &head, out, &resp); err != nil {
				break
			}
		}
		if !ok {
			h.handOver(fc)
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

// handOver gives the connection, with whatever is buffered, to net/http.
func (h *http1) handOver(fc *fastConn) {
	_ = fc.c.SetReadDeadline(time.Time{}) // net/http sets its own
	c := &bufferedConn{Conn: fc.c, r: fc.r}
	if !h.handoff.put(c) {
		fc.c.Close()
	}
}

// peekHead waits for a whole request head and parses it without consuming
// it. ok is false when the request is not one the fast path answers.
func peekHead(fc *fastConn) (checkHead, bool, error) {
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
		if len(buf) == fastBufSize {
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
		case asciiEqualFold(name, "content-length"):
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
		case asciiEqualFold(name, "host"):
			if host {
				return false
			}
			host = true
		case asciiEqualFold(name, "connection"):
			switch {
			case asciiEqualFold(val, "close"):
				head.close = true
			case asciiEqualFold(val, "keep-alive"):
			default:
				return false
			}
		case asciiEqualFold(name, "x-request-id"):
			if head.requestID == nil {
				head.requestID = val
			}
		case asciiEqualFold(name, "authorization"):
			if head.auth != nil {
				return false
			}
			head.auth = val
		case asciiEqualFold(name, "transfer-encoding"), asciiEqualFold(name, "expect"),
			asciiEqualFold(name, "upgrade"), asciiEqualFold(name, "trailer"):
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

// asciiEqualFold compares b with the lower-case ASCII string s.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
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

// fastCheck answers a check whose head is parsed. It returns false, having
// consumed nothing, when net/http must answer instead.
func (s *Server) fastCheck(fc *fastConn, head *checkHead, out *outBufs, resp *rules.CheckResponse) (bool, error) {
	start := time.Now()
	total := head.n + head.contentLength
	if total > fastBufSize {
		return false, nil
	}
	if s.set.CheckToken != "" {
		tok, ok := bearerValue(head.auth)
		if !ok || !keyMatches(tok, s.checkSum) {
			return false, nil
		}
	}
	raw, err := fc.r.Peek(total)
	if err != nil {
		return false, err
	}
	req, err := rules.DecodeCheckRequest(raw[head.n:])
	if err != nil {
		return false, nil // the seed API shape or an invalid body
	}
	var reqID string
	if head.requestID != nil {
		reqID = string(head.requestID)
	} else {
		reqID = newRequestID()
	}
	_, _ = fc.r.Discard(total)
	if req.RequestID == "" {
		req.RequestID = reqID
	}
	b := out.head[:0]
	if err := s.decide(context.Background(), &req, resp); err != nil {
		status, code, msg := s.checkError(err)
		b = appendErrorResponse(b, status, code, msg, reqID, head.close)
	} else {
		body := rules.AppendCheckResponse(out.body[:0], resp)
		out.body = body
		b = append(b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: "...)
		b = append(b, reqID...)
		if i := mostRestrictive(&req, resp); i >= 0 {
			b = appendLimitHeaders(b, &resp.Decisions[i], req.Limits[i].Spec.Algorithm)
		}
		b = appendCommonHeaders(b, head.close)
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n\r\n"...)
		b = append(b, body...)
		s.m.checkDur.Observe(time.Since(start).Seconds())
	}
	out.head = b
	_, err = fc.c.Write(b)
	return true, err
}

// outBufs are a connection's reusable answer buffers.
type outBufs struct{ head, body []byte }

func bearerValue(a []byte) (string, bool) {
	if len(a) > 7 && asciiEqualFold(a[:7], "bearer ") {
		return string(bytes.TrimSpace(a[7:])), true
	}
	return "", false
}

// appendLimitHeaders writes the X-RateLimit-* headers as net/http spells them.
func appendLimitHeaders(b []byte, d *rules.Decision, alg rules.Algorithm) []byte {
	b = append(b, "\r\nX-Ratelimit-Limit: "...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, "\r\nX-Ratelimit-Remaining: "...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, "\r\nX-Ratelimit-Reset: "...)
	b = strconv.AppendInt(b, ceilDiv(d.ResetMS, 1000), 10)
	b = append(b, "\r\nX-Ratelimit-Strategy: "...)
	return append(b, alg.String()...)
}

// appendCommonHeaders ends the previous header line and adds Date and,
// when the client asked for it, Connection: close.
func appendCommonHeaders(b []byte, close bool) []byte {
	b = append(b, "\r\nDate: "...)
	b = append(b, httpDate()...)
	b = append(b, "\r\n"...)
	if close {
		b = append(b, "Connection: close\r\n"...)
	}
	return b
}

// appendErrorResponse writes a whole error answer with the envelope.
func appendErrorResponse(b []byte, status int, code, msg, reqID string, close bool) []byte {
	body := errorBody(code, msg, nil, reqID)
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, statusText(status)...)
	b = append(b, "\r\nContent-Type: application/json\r\nX-Request-Id: "...)
	b = append(b, reqID...)
	if status == 503 {
		b = append(b, "\r\nRetry-After: 1"...)
	}
	b = appendCommonHeaders(b, close)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, body...)
}

func statusText(status int) string {
	switch status {
	case 503:
		return "Service Unavailable"
	default:
		return "Internal Server Error"
	}
}

// dateCache holds the Date header value, renewed once a second.
var dateCache atomic.Pointer[dateEntry]

type dateEntry struct {
	sec int64
	val string
}

func httpDate() string {
	now := time.Now()
	if e := dateCache.Load(); e != nil && e.sec == now.Unix() {
		return e.val
	}
	e := &dateEntry{sec: now.Unix(), val: now.UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT")}
	dateCache.Store(e)
	return e.val
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
