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
	// when the answer is whole. ctx ends at the call-out's timeout.
	ServeCallout(ctx context.Context, req *Request, res *Response)
}

// Request is a call-out as the plugin sent it, valid during ServeCallout.
type Request struct {
	// Headers are the call-out's headers, pseudo-headers included, in
	// proxy-wasm's serialized map (internal/pwmap).
	Headers []byte
	Body    []byte
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
	// Headers by name as ServeHTTP would set them in its ResponseWriter's
	// header map; one value each.
	Headers [][2]string
	Body    []byte
}

// Reset empties r for the next answer, keeping its storage.
func (r *Response) Reset() {
	r.Status = 0
	r.Headers = r.Headers[:0]
	r.Body = r.Body[:0]
}

// Set sets header name to value, replacing an earlier value of the same
// name, as a ResponseWriter's header map would keep it.
func (r *Response) Set(name, value string) {
	for i := range r.Headers {
		if r.Headers[i][0] == name {
			r.Headers[i][1] = value
			return
		}
	}
	r.Headers = append(r.Headers, [2]string{name, value})
}
