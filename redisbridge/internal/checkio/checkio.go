// Package checkio is the contract between the bridge's check transports
// and its check core. A transport (net/http, the HTTP/1.1 and h2c fast
// paths) reads a POST /v1/rate-limit/check off its connection into a
// Request, has the Handler fill a Response, and writes that out in its own
// framing, adding only the headers of the framing (Date, Content-Length,
// Connection). Envoy's rate limit service's gRPC calls (net/http, the h2c
// fast path) go through the same contract to their own Handler; their
// answers carry trailers.
// Responses are reused from one request to the next, so a transport that
// keeps one per connection answers without allocating for the answer.
package checkio

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"
)

// ConnAge is the age at which a transport asks a connection's client to
// go elsewhere, for a maximum age d (--max-connection-age): d give or
// take a tenth at random, so that the connections a proxy opened
// together do not all reconnect at once.
func ConnAge(d time.Duration) time.Duration {
	return d - d/10 + time.Duration(rand.Int64N(int64(d/5)+1))
}

// Request is one check request. Its slices belong to the transport and are
// valid only during Handler.ServeCheck.
type Request struct {
	Authorization []byte // the Authorization header's value; nil when absent
	RequestID     []byte // the X-Request-Id header's value; nil when absent or empty
	Body          []byte
	// BodyErr is why the body could not be read whole, as net/http's
	// handler would have met it (an *http.MaxBytesError past the bridge's
	// limit, a Content-Length the body does not match); the handler
	// answers it.
	BodyErr error
	// GRPCTimeout is a gRPC call's grpc-timeout header; nil when absent.
	GRPCTimeout []byte
}

// Header is one response header. Names are in canonical form
// (textproto.CanonicalMIMEHeaderKey), as net/http writes them.
type Header struct {
	Name  string
	Value []byte
}

// Response is the answer to a check.
type Response struct {
	Status  int
	Headers []Header
	Body    []byte
	// Trailers follow the body (a gRPC call's status); none for a check.
	Trailers []Header
	vals     []byte // storage of header values
}

// Reset empties r for the next answer, keeping its storage.
func (r *Response) Reset() {
	r.Status = 0
	r.Headers = r.Headers[:0]
	r.Body = r.Body[:0]
	r.Trailers = r.Trailers[:0]
	r.vals = r.vals[:0]
}

// SetTrailer adds a trailer.
func (r *Response) SetTrailer(name, value string) {
	start := len(r.vals)
	r.vals = append(r.vals, value...)
	r.Trailers = append(r.Trailers, Header{Name: name, Value: r.vals[start:len(r.vals):len(r.vals)]})
}

// Set adds a header.
func (r *Response) Set(name, value string) {
	start := len(r.vals)
	r.vals = append(r.vals, value...)
	r.add(name, start)
}

// SetInt adds a header with a decimal value.
func (r *Response) SetInt(name string, n int64) {
	start := len(r.vals)
	r.vals = strconv.AppendInt(r.vals, n, 10)
	r.add(name, start)
}

// add records the value at vals[start:]. A value stays valid when vals
// grows later: it keeps pointing at the storage it was written to.
func (r *Response) add(name string, start int) {
	r.Headers = append(r.Headers, Header{Name: name, Value: r.vals[start:len(r.vals):len(r.vals)]})
}

// Get returns the value of the header name ("" when absent).
func (r *Response) Get(name string) string {
	for _, h := range r.Headers {
		if h.Name == name {
			return string(h.Value)
		}
	}
	return ""
}

// Handler answers check requests. ServeCheck fills resp (after Reset) and
// returns when the answer is complete; ctx ends when the client is gone.
type Handler interface {
	ServeCheck(ctx context.Context, req *Request, resp *Response)
}

// HandlerFunc is a function as a Handler.
type HandlerFunc func(ctx context.Context, req *Request, resp *Response)

// ServeCheck calls f.
func (f HandlerFunc) ServeCheck(ctx context.Context, req *Request, resp *Response) { f(ctx, req, resp) }

// Date is the value of a Date header for now (http.TimeFormat), made once
// a second, for every transport.
func Date() string {
	now := time.Now()
	if e := dateCache.Load(); e != nil && e.sec == now.Unix() {
		return e.val
	}
	e := &dateEntry{sec: now.Unix(), val: now.UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT")}
	dateCache.Store(e)
	return e.val
}

var dateCache atomic.Pointer[dateEntry]

type dateEntry struct {
	sec int64
	val string
}
