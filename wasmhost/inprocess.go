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
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/inproc"
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
	defer h.recoverInProcess(cl, a, &res)
	cl.handler.ServeHTTP(a, req)
	if failed := h.inProcessFailure(ctx.Err(), a.body.Len()); failed != nil {
		return failed
	}
	_, sized := a.header["Content-Length"]
	hm := replyHeaders(a.status, len(a.header), a.body.Len(), sized)
	for k, vs := range a.header {
		name := lowerName(k)
		for _, v := range vs {
			hm = append(hm, [2]string{name, v})
		}
	}
	return &calloutResponse{headers: hm, body: a.body.Bytes()}
}

// serveCallout answers a call-out that an in-process cluster's handler
// serves as an inproc.Server: as serveInProcess would with its ServeHTTP,
// from the bytes the plugin sent. Its timeout is c.req.Deadline, not a
// context's (inproc.Request).
func (h *Host) serveCallout(cl *cluster, c *inprocCall) (res *calloutResponse) {
	a := inprocAnswers.Get().(*inproc.Response)
	defer inprocAnswers.Put(a)
	a.Reset()
	defer h.recoverInProcess(cl, nil, &res)
	c.srv.ServeCallout(h.ctx, &c.req, a)
	err := h.ctx.Err()
	if d := c.req.Deadline; err == nil && !d.IsZero() && !time.Now().Before(d) {
		err = context.DeadlineExceeded // as the context of serveInProcess's request would end
	}
	if failed := h.inProcessFailure(err, len(a.Body)); failed != nil {
		return failed
	}
	hm := replyHeaders(a.Status, a.HeaderCount(), len(a.Body), a.Has("Content-Length"))
	n := len(hm)
	hm = a.AppendHeaders(hm)
	for i := n; i < len(hm); i++ {
		hm[i][0] = lowerName(hm[i][0])
	}
	return &calloutResponse{headers: hm, body: bytes.Clone(a.Body)}
}

// inprocCall is a call-out for an inproc.Server, its bytes copied out of
// the guest's memory into buf (from calloutBuffers).
type inprocCall struct {
	srv inproc.Server
	buf *[]byte
	req inproc.Request
}

var inprocAnswers = sync.Pool{New: func() any { return new(inproc.Response) }}

// recoverInProcess, deferred, turns a panic of an in-process handler into
// the failure a server's closed connection would be (serveInProcess), and
// logs it. a is ServeHTTP's answer, nil for ServeCallout, which has none
// until it returns.
func (h *Host) recoverInProcess(cl *cluster, a *answer, res **calloutResponse) {
	p := recover()
	if p == nil {
		return
	}
	if l := h.opts.Logger; l != nil {
		l.Error("wasmhost: the handler of an in-process cluster panicked", "cluster", cl.name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
	if a != nil && a.status != 0 {
		*res = &calloutResponse{failed: true}
		return
	}
	*res = failedBeforeResponse(nil, false) // the connection ended before an answer
}

// inProcessFailure is what replaces an in-process answer with a body of n
// bytes, ctxErr the error of the call-out's context once it answered: nil
// when it stands.
func (h *Host) inProcessFailure(ctxErr error, n int) *calloutResponse {
	switch {
	case errors.Is(ctxErr, context.DeadlineExceeded) && !h.closed.Load():
		return failedBeforeResponse(ctxErr, true)
	case ctxErr != nil:
		return &calloutResponse{failed: true} // the host is closing
	case int64(n) > h.opts.MaxCalloutBody:
		return &calloutResponse{failed: true} // as a body over the limit from a connection
	}
	return nil
}

// replyHeaders starts the header map of an in-process answer with status
// (none or an informational one, which answer skips: 200) and room for n
// more, and the body's length unless sized (the handler set
// Content-Length), as a server would write it.
func replyHeaders(status, n, bodyLen int, sized bool) fields.Map {
	if status < http.StatusOK {
		status = http.StatusOK
	}
	hm := make(fields.Map, 0, n+2)
	hm = append(hm, [2]string{":status", statusString(status)})
	if !sized {
		hm = append(hm, [2]string{"content-length", strconv.Itoa(bodyLen)})
	}
	return hm
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
