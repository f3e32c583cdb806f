package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/internal/h1pool"
	"github.com/sluicehq/sluice/internal/rawsock"
	"github.com/sluicehq/sluice/wasmhost"
)

// upstreamTransport sends the gateway's requests to its upstream. A
// request that is plain HTTP and has no body to send (most API requests:
// GET, HEAD, DELETE) goes out on a kept-alive connection (internal/h1pool)
// and is written and answered on the request's own goroutine; net/http's
// Transport hands each exchange to a writer and a reader goroutine of the
// connection, and with the gateway idle between requests each hand-off
// wakes another thread. Everything else (a body to stream, an upgrade,
// Expect: 100-continue, HTTPS, a proxy from the environment) goes through
// net/http's Transport, as every request did before.
//
// It answers as that Transport does: the same request on the wire (but for
// the Accept-Encoding: gzip the Transport adds and undoes), headers checked
// the same way before anything is sent, informational answers passed to
// the request's httptrace (ReverseProxy forwards them), a kept-alive
// connection the server closed found before use (h1pool), an idempotent
// request retried once when a reused connection fails before any answer,
// the exchange cut when the request's context ends, answer heads bounded
// to 10 MB, idle connections closed after 90 s.
//
// With a timeout, the whole exchange, the answer's body included, ends
// that long after it began, as Envoy's route timeout (isTimeout reports
// the error): on the gateway's own connections through the connection's
// deadline, which costs a request nothing more, and on the Transport's
// through the request's context. Upgrades, which may last, have none.
//
// With http2, every request goes through a Transport that speaks only
// HTTP/2: with prior knowledge (h2c) to an http:// upstream, by ALPN to an
// https:// one, as an Envoy cluster with http2_protocol_options; what a
// gRPC upstream needs.
type upstreamTransport struct {
	pool     h1pool.Pool
	fallback http.RoundTripper
	timeout  time.Duration
	http2    bool
}

func newUpstreamTransport(timeout time.Duration, http2 bool, tlsConfig *tls.Config) *upstreamTransport {
	tr := wasmhost.NewTransport()
	// Requests with a body, HTTPS and HTTP/2 go through it: their
	// connections raw, as the pool's are.
	tr.DialContext = rawsock.DialContext(tr.DialContext)
	if tlsConfig != nil { // --upstream-tls-ca
		tr.TLSClientConfig = tlsConfig.Clone()
	}
	if http2 {
		var p http.Protocols
		p.SetHTTP2(true)
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	return &upstreamTransport{
		pool:     h1pool.Pool{IdleTimeout: 90 * time.Second, DialTimeout: 30 * time.Second},
		fallback: tr,
		timeout:  timeout,
		http2:    http2,
	}
}

// isTimeout reports whether err is an exchange's end at the transport's
// timeout (or a dial's at its own).
func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// maxResponseHead is net/http's Transport's default bound on an answer's
// head (MaxResponseHeaderBytes).
const maxResponseHead = 10 << 20

// aLongTimeAgo is a deadline that has passed: setting it ends a read or
// write in progress.
var aLongTimeAgo = time.Unix(1, 0)

func (t *upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var end time.Time
	if t.timeout > 0 {
		end = time.Now().Add(t.timeout)
	}
	if t.http2 || !direct(req) {
		if end.IsZero() || req.Header.Get("Upgrade") != "" {
			return t.fallback.RoundTrip(req)
		}
		ctx, cancel := context.WithDeadline(req.Context(), end)
		resp, err := t.fallback.RoundTrip(req.WithContext(ctx))
		if err != nil {
			cancel()
			return nil, err
		}
		resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	resp, retry, err := t.exchange(req, end)
	if retry {
		resp, _, err = t.exchange(req, end)
	}
	return resp, err
}

// cancelBody ends its exchange's context once the body is read or closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.cancel()
	}
	return n, err
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// direct reports whether req goes out on the gateway's own connections:
// plain HTTP with a host, no body, no trailers, no upgrade or expectation,
// no proxy, and a method and headers the Transport would send (the
// Transport gives its error for the others).
func direct(req *http.Request) bool {
	if req.URL == nil || req.URL.Scheme != "http" || req.URL.Host == "" || req.Header == nil ||
		(req.Body != nil && req.Body != http.NoBody) || req.ContentLength != 0 ||
		len(req.TransferEncoding) > 0 || len(req.Trailer) > 0 || req.Cancel != nil {
		return false
	}
	if req.Method != "" && !httpguts.ValidHeaderFieldName(req.Method) { // a token, as the Transport checks it
		return false
	}
	for k, vs := range req.Header {
		switch k {
		case "Upgrade", "Expect":
			return false
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	if proxy, err := http.ProxyFromEnvironment(req); proxy != nil || err != nil {
		return false
	}
	return true
}

// exchange sends req on a connection of the pool and reads the answer's
// head; the exchange ends at end, unless it is zero. retry: the exchange
// failed on a reused connection before any answer came, and req may be
// sent again.
func (t *upstreamTransport) exchange(req *http.Request, end time.Time) (resp *http.Response, retry bool, err error) {
	// As net/http's persistConn.readResponse (Go 1.26), which the
	// tests compare this with.
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	deadline, _ := ctx.Deadline()
	if !end.IsZero() && (deadline.IsZero() || end.Before(deadline)) {
		deadline = end
	}
	c, err := t.pool.Get(addr, deadline)
	if err != nil {
		return nil, false, err
	}
	if !end.IsZero() {
		c.SetDeadline(end) // Put clears it
	}
	cut := context.AfterFunc(ctx, func() { c.SetDeadline(aLongTimeAgo) })
	fail := func(err error, answered bool) (*http.Response, bool, error) {
		cut()
		t.pool.Put(c, false)
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		if isTimeout(err) {
			return nil, false, err // the whole exchange's time is spent
		}
		return nil, !answered && c.Reused && replayable(req), err
	}
	if err := req.Write(c.W); err != nil {
		return fail(err, false)
	}
	if err := c.W.Flush(); err != nil {
		return fail(err, false)
	}
	c.LimitReads(maxResponseHead)
	if _, err := c.R.Peek(1); err != nil {
		return fail(err, false)
	}
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.GotFirstResponseByte != nil {
		trace.GotFirstResponseByte()
	}
	for {
		if resp, err = http.ReadResponse(c.R, req); err != nil {
			return fail(err, true)
		}
		code := resp.StatusCode
		if code >= 200 || code == http.StatusSwitchingProtocols {
			break
		}
		// Informational answers go to the trace, and each delivered
		// resets the bound on the heads; those nobody looked at count
		// against the final answer's, as in the Transport.
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err, true)
			}
			c.LimitReads(maxResponseHead)
		}
	}
	c.LimitReads(-1)
	b := &upstreamBody{t: t, c: c, cut: cut, body: resp.Body, reuse: !resp.Close && !req.Close}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Not asked for (an upgrade goes through the Transport): the
		// proxy refuses it (net/http gives it no body), and the
		// connection is not the next request's.
		b.reuse = false
	}
	if resp.Body == http.NoBody {
		b.done(true) // nothing to read: the connection is free now
		return resp, false, nil
	}
	resp.Body = b
	return resp, false, nil
}

// replayable reports whether req may be sent again, as net/http's
// Request.isReplayable (req has no body here).
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// upstreamBody is an answer's body on a pooled connection: read to its end
// (net/http's body reader stops exactly there, trailers included), the
// connection goes back to the pool; closed before, it is closed.
type upstreamBody struct {
	t     *upstreamTransport
	c     *h1pool.Conn
	cut   func() bool // stops the context's cut; false once it has cut
	body  io.ReadCloser
	reuse bool

	mu       sync.Mutex // Close may come from another goroutine than Read
	finished bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err != nil {
		b.done(err == io.EOF)
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	b.done(false)
	return nil
}

// done gives the connection back, reusable when the body was read to its
// end and neither side asked to close it, and the context did not cut it.
func (b *upstreamBody) done(atEOF bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.finished {
		return
	}
	b.finished = true
	notCut := b.cut()
	b.t.pool.Put(b.c, atEOF && b.reuse && notCut)
}

// serviceTimed sets x-envoy-upstream-service-time on the upstream's
// answers, as Envoy's router does unless suppress_envoy_headers
// (source/common/router/router.cc, onUpstreamHeaders): the milliseconds
// from when the request was complete, its body sent whole, until the
// answer's headers came, on the clock now. The upstream's own value is
// replaced; an answer that came before the request's body ended keeps it,
// since Envoy then sets none.
type serviceTimed struct {
	next http.RoundTripper
	now  func() time.Time
}

func (t serviceTimed) RoundTrip(req *http.Request) (*http.Response, error) {
	start := t.now()
	var body *bodyEnd
	if req.Body != nil && req.Body != http.NoBody {
		body = &bodyEnd{ReadCloser: req.Body, now: t.now}
		req.Body = body
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if body != nil {
		end := body.at.Load()
		if end == 0 {
			return resp, nil // premature: the request is not complete
		}
		start = time.Unix(0, end)
	}
	resp.Header[serviceTimeHeader] = serviceTime(t.now().Sub(start).Milliseconds())
	return resp, nil
}

const serviceTimeHeader = "X-Envoy-Upstream-Service-Time"

// bodyEnd notes when its body was read to its end. The transport reads a
// request's body on a goroutine of its own.
type bodyEnd struct {
	io.ReadCloser
	now func() time.Time
	at  atomic.Int64 // unix ns; 0 until the end
}

func (b *bodyEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.at.Load() == 0 {
		b.at.Store(b.now().UnixNano())
	}
	return n, err
}

// serviceTime is the header value for ms milliseconds: shared values
// under a second (never written in place, as protoHTTP), so a request
// allocates none for it.
func serviceTime(ms int64) []string {
	if ms >= 0 && ms < int64(len(serviceTimes)) {
		return serviceTimes[ms]
	}
	return []string{strconv.FormatInt(ms, 10)}
}

var serviceTimes = func() (v [1000][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()
