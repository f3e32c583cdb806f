// Package inproc lets a service embedded in the gateway answer the
// plugin's call-outs from the bytes the plugin sent, without the
// http.Request, ResponseWriter and header maps of net/http in between.
//
// A wasmhost in-process cluster (wasmhost.Options.Handlers) whose
// http.Handler is also a Server hands it the call-outs it Serves; the
// others still go to ServeHTTP. A Server answers a call-out exactly as its
// ServeHTTP answers the request net/http would make of it: the plugin
// cannot tell the two apart, only the work differs (for the embedded
// bridge, half the allocations of a call-out request).
package inproc

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/asciifold"
	"github.com/sluicehq/sluice/internal/pwmap"
)

// Server answers call-outs in process.
type Server interface {
	// Serves reports whether ServeCallout answers call-outs with this
	// :method and :path. It may only accept a method and path that
	// http.NewRequest takes, since the host checks those only for the
	// call-outs it sends to ServeHTTP.
	Serves(method, path []byte) bool
	// ServeCallout answers req into res, which comes reset; it returns
	// when the answer is whole. ctx ends when the host closes, not at the
	// call-out's timeout, req.Deadline: a server that may wait bounds
	// its waits by that itself (context.WithDeadline). The host drops an
	// answer that comes later for the timeout's 504.
	ServeCallout(ctx context.Context, req *Request, res *Response)
}

// Request is a call-out as the plugin sent it, valid during ServeCallout.
type Request struct {
	// Headers are the call-out's headers, pseudo-headers included, in
	// proxy-wasm's serialized map (internal/pwmap).
	Headers []byte
	Body    []byte
	// Deadline is when the call-out times out; zero: never. It is not
	// in ServeCallout's ctx: a timer and a context per call-out cost the
	// gateway more than the embedded bridge's memory store spends on the
	// check, and that store never waits.
	Deadline time.Time
}

// Header is the value of the first header named name, in any case: nil
// when there is none, empty but not nil when the value is. It is what
// http.Header.Get gives on the request the host makes of the call-out for
// ServeHTTP, its names canonicalized, its pseudo-headers left out.
func (r *Request) Header(name string) []byte {
	name = asciifold.Lower(name)
	var v []byte
	found := false
	_ = pwmap.Visit(r.Headers, func(k, val []byte) {
		if !found && (len(k) == 0 || k[0] != ':') && asciifold.EqualLower(k, name) {
			v, found = val, true
		}
	})
	if found && v == nil {
		v = []byte{}
	}
	return v
}

// Response is a call-out's answer.
type Response struct {
	Status int // 0, or an informational status, which a ResponseWriter skips: 200
	Body   []byte

	// The headers, by name as ServeHTTP would set them in its
	// ResponseWriter's header map, one value each, their values in values.
	fields []field
	values []byte
}

// field is a header of a Response: its value is values[start:end].
type field struct {
	name       string
	start, end int
}

// Reset empties r for the next answer, keeping its storage.
func (r *Response) Reset() {
	r.Status = 0
	r.fields, r.values = r.fields[:0], r.values[:0]
	r.Body = r.Body[:0]
}

// Set sets header name to a copy of value, replacing an earlier value of
// the same name in its place, as a ResponseWriter's header map would keep
// it.
func (r *Response) Set(name string, value []byte) {
	f := field{name: name, start: len(r.values)}
	r.values = append(r.values, value...)
	f.end = len(r.values)
	if i := r.index(name); i >= 0 {
		r.fields[i] = f
		return
	}
	r.fields = append(r.fields, f)
}

// Has reports whether header name is set.
func (r *Response) Has(name string) bool { return r.index(name) >= 0 }

func (r *Response) index(name string) int {
	for i := range r.fields {
		if r.fields[i].name == name {
			return i
		}
	}
	return -1
}

// HeaderCount is the number of headers set.
func (r *Response) HeaderCount() int { return len(r.fields) }

// AppendHeaders appends the headers to dst, each as its name and value,
// the values sharing one string: one allocation for all of them.
func (r *Response) AppendHeaders(dst [][2]string) [][2]string {
	text := string(r.values)
	for _, f := range r.fields {
		dst = append(dst, [2]string{f.name, text[f.start:f.end]})
	}
	return dst
}
