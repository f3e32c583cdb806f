package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// serveInProcess answers a call-out to a cluster of Options.Handlers: its
// handler serves req, with the call-out's timeout in req's context, as a
// server would after reading it off a connection, but on the call-out's
// goroutine and with no connection, socket or system call in between. An
// answer that comes after the timeout is dropped for the 504 Envoy's
// router gives. A handler that panics fails the call-out as net/http's
// server would make it fail, by closing the connection: before it wrote
// anything, as a connection reset before the answer (503); after, as a
// reset midway. The panic goes to Options.Logger with its stack.
func (h *Host) serveInProcess(cl *cluster, req *http.Request) (res *calloutResponse) {
	ctx := req.Context()
	// A server's request: its target as the request line had it.
	req.RequestURI = req.URL.RequestURI()
	req.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	req.RemoteAddr = "in-process"
	a := &answer{header: http.Header{}, max: h.opts.MaxCalloutBody}
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if l := h.opts.Logger; l != nil {
			l.Error("wasmhost: the handler of an in-process cluster panicked", "cluster", cl.name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
		if a.status != 0 {
			res = &calloutResponse{failed: true}
			return
		}
		res = failedBeforeResponse(nil, false) // the connection ended before an answer
	}()
	cl.handler.ServeHTTP(a, req)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && !h.closed.Load():
		return failedBeforeResponse(ctx.Err(), true)
	case ctx.Err() != nil:
		return &calloutResponse{failed: true} // the host is closing
	case int64(a.body.Len()) > a.max:
		return &calloutResponse{failed: true} // as a body over the limit from a connection
	}
	if a.status == 0 {
		a.status = http.StatusOK
	}
	hm := make(fields.Map, 0, len(a.header)+2)
	hm = append(hm, [2]string{":status", statusString(a.status)})
	for k, vs := range a.header {
		name := lowerName(k)
		for _, v := range vs {
			hm = append(hm, [2]string{name, v})
		}
	}
	if _, ok := a.header["Content-Length"]; !ok { // as a server would write it
		hm = append(hm, [2]string{"content-length", strconv.Itoa(a.body.Len())})
	}
	return &calloutResponse{headers: hm, body: a.body.Bytes()}
}

// answer is the response writer of an in-process call-out. It keeps a
// byte past max, for serveInProcess to see the body is over the limit,
// and refuses what comes after it.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
	max    int64
}

func (a *answer) Header() http.Header { return a.header }

// WriteHeader keeps the first final status; informational ones are
// skipped, as Envoy's codec skips them.
func (a *answer) WriteHeader(code int) {
	if a.status == 0 && code >= 200 {
		a.status = code
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	if room := a.max + 1 - int64(a.body.Len()); int64(len(p)) > room {
		room = max(room, 0)
		a.body.Write(p[:room])
		return int(room), errBodyTooLarge
	}
	return a.body.Write(p)
}

// Flush lets handlers that flush run; the answer is whole when they return.
func (a *answer) Flush() {}
