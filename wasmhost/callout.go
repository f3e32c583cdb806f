package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/internal/asciifold"
	"github.com/sluicehq/sluice/internal/inproc"
	"github.com/sluicehq/sluice/internal/unixaddr"
	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// httpCall implements proxy_http_call as Envoy's Context::httpCall: an
// unknown cluster or a request without :method, :path and :authority is a
// BadArgument; otherwise the request goes to the cluster's base URL from a
// goroutine, and its outcome (see fetch) is delivered to
// proxy_on_http_call_response on the root context of the dispatching VM.
func (h *Host) httpCall(in *instance, m api.Memory, p []uint64) Status {
	name, ok1 := read(m, u32(p, 0), u32(p, 1))
	hb, ok2 := read(m, u32(p, 2), u32(p, 3))
	body, ok3 := read(m, u32(p, 4), u32(p, 5))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	cl, known := h.clusters[string(name)]
	if !known {
		return StatusBadArgument // Envoy: cluster not found
	}
	// The first of each pseudo header, its name in any case, as views
	// into guest memory, valid during this call.
	var pseudo [3][]byte // :method, :path, :authority
	var seen [3]bool
	err := fields.Visit(hb, func(k, v []byte) {
		for i, want := range [3]string{":method", ":path", ":authority"} {
			if !seen[i] && asciifold.EqualLower(k, want) {
				pseudo[i], seen[i] = v, true
			}
		}
	})
	if err != nil || !seen[0] || !seen[1] || !seen[2] {
		return StatusBadArgument
	}
	method, path, authority := pseudo[0], pseudo[1], pseudo[2]
	c := &callout{cluster: cl, timeout: time.Duration(u32(p, 8)) * time.Millisecond}
	if srv, ok := cl.handler.(inproc.Server); ok && srv.Serves(method, path) {
		// Copied: the guest's memory is only valid during this call.
		buf := calloutBuffers.Get().(*[]byte)
		b := append(append((*buf)[:0], hb...), body...)
		*buf = b
		c.kind = viaInproc
		c.inproc = inprocCall{srv: srv, buf: buf, req: inproc.Request{Headers: b[:len(hb):len(hb)], Body: b[len(hb):]}}
	} else if t, direct := cl.h1Target(path); direct {
		if !validName(method) {
			return StatusBadArgument // as http.NewRequest
		}
		buf := calloutBuffers.Get().(*[]byte)
		raw, valid := appendH1Request((*buf)[:0], method, t.uri, authority, hb, body)
		*buf = raw
		c.kind = viaH1
		c.h1 = h1Request{addr: t.addr, head: string(method) == http.MethodHead, raw: raw, buf: buf, valid: valid}
	} else {
		hm, _ := fields.Parse(hb) // its layout is checked
		target := strings.TrimSuffix(cl.base, "/") + string(path)
		req, err := http.NewRequest(string(method), target, bytes.NewReader(append([]byte(nil), body...)))
		if err != nil {
			return StatusBadArgument
		}
		req.Host = string(authority)
		for _, kv := range hm {
			if !strings.HasPrefix(kv[0], ":") {
				req.Header.Add(kv[0], kv[1])
			}
		}
		c.req = req
	}
	id := in.newCallID()
	if !m.WriteUint32Le(u32(p, 9), id) {
		c.release()
		return StatusInvalidMemoryAccess
	}
	h.wg.Add(1)
	j := calloutJob{in, id, c}
	if in.inlineOK && in.inline.c == nil && c.timeout > 0 {
		// Sent by the stream's own goroutine once the callback returns,
		// if the stream waits (Stream.await). A timeout bounds how long
		// that goroutine cannot see its request's context end.
		in.inline = j
	} else {
		h.workers.run(j)
	}
	return StatusOK
}

// headerCallback calls a stream's header callback fn with args, letting
// its first call-out be sent inline (instance.inline), and returns the
// callback's action and that call-out. vm.mu is held.
func (in *instance) headerCallback(fn api.Function, args ...uint64) (uint64, calloutJob, error) {
	in.inlineOK = true
	action, err := in.call(fn, args...)
	j := in.inline
	in.inlineOK, in.inline = false, calloutJob{}
	return action, j, err
}

// newCallID returns the token of a new call-out. As Envoy's, tokens count
// up from 1 and skip 0 when they wrap (Context::httpCall in
// source/extensions/common/wasm/context.cc).
func (in *instance) newCallID() uint32 {
	in.nextCallID++
	if in.nextCallID == 0 {
		in.nextCallID++
	}
	return in.nextCallID
}

// cluster is a call-out cluster: its base URL, its call-outs in flight
// (Envoy's circuit breaker), and for a plain-HTTP one, where each path it
// was called with goes.
type cluster struct {
	name     string
	base     string
	handler  http.Handler // serves its call-outs in process (Options.Handlers)
	inflight atomic.Int64
	h1       bool // the host's own HTTP/1.1 client sends its call-outs
	mu       sync.Mutex
	targets  map[string]h1Target // by :path, at most maxTargets
}

// h1Target is where a call-out of a plain-HTTP cluster goes.
type h1Target struct {
	direct bool   // false: net/http sends it (the URL did not parse)
	addr   string // host:port, or a Unix socket's path
	uri    string // the request target
}

// maxTargets bounds the paths a cluster keeps targets for: a plugin calls
// out on a few, and one that makes up a path per call-out parses each.
const maxTargets = 64

// newClusters is Options.Clusters and Options.Handlers with what each
// call-out needs.
func (h *Host) newClusters() (map[string]*cluster, error) {
	opts := &h.opts
	out := make(map[string]*cluster, len(opts.Clusters)+len(opts.Handlers))
	for name, base := range opts.Clusters {
		out[name] = &cluster{base: base, targets: map[string]h1Target{},
			h1: opts.HTTPClient == nil && strings.HasPrefix(base, "http://") || strings.HasPrefix(base, unixaddr.Scheme)}
	}
	for name, hd := range opts.Handlers {
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("wasmhost: cluster %q is in both Clusters and Handlers", name)
		}
		// The URL's host is only a placeholder: the handler sees the
		// call-out's :authority as the request's Host.
		out[name] = &cluster{name: name, base: "http://in-process", handler: hd}
	}
	return out, nil
}

// h1Target is where a call-out on path goes when the host's HTTP/1.1
// client sends it: a plain-HTTP cluster, no Options.HTTPClient (tests and
// embedders that bring one get it used), and a URL that parses.
func (cl *cluster) h1Target(path []byte) (h1Target, bool) {
	if !cl.h1 {
		return h1Target{}, false
	}
	cl.mu.Lock()
	t, ok := cl.targets[string(path)]
	cl.mu.Unlock()
	if ok {
		return t, t.direct
	}
	if strings.HasPrefix(cl.base, unixaddr.Scheme) {
		// The socket's path, then the call-out's own request target.
		sock, ok := unixaddr.Path(cl.base)
		if u, err := url.Parse("http://unix" + string(path)); err == nil && ok && u.Host == "unix" {
			t = h1Target{direct: true, addr: sock, uri: u.RequestURI()}
		}
	} else if u, err := url.Parse(strings.TrimSuffix(cl.base, "/") + string(path)); err == nil && u.Host != "" && u.User == nil {
		if u.Port() == "" {
			u.Host = net.JoinHostPort(u.Hostname(), "80")
		}
		t = h1Target{direct: true, addr: u.Host, uri: u.RequestURI()}
	}
	cl.mu.Lock()
	if len(cl.targets) < maxTargets {
		cl.targets[string(path)] = t
	}
	cl.mu.Unlock()
	return t, t.direct
}

// calloutJob is a call-out for a worker, or for the goroutine of the
// stream that dispatched it: runCallout's arguments.
type calloutJob struct {
	in *instance
	id uint32
	c  *callout
}

// calloutWorkers run call-outs on goroutines that outlive them. A call-out
// needs a deep stack (the HTTP exchange, then the plugin's callback through
// wazero), and a goroutine started for each one grew its stack, by
// copying it, several times per call-out: more work than all the rest the
// host does for it. Workers wait for the next call-out instead, up to
// maxIdleWorkers of them.
type calloutWorkers struct {
	h      *Host
	mu     sync.Mutex
	idle   []chan calloutJob
	closed bool
}

const maxIdleWorkers = 1024

func (w *calloutWorkers) run(j calloutJob) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		c := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		c <- j // buffered: the worker is waiting for it
		return
	}
	w.mu.Unlock()
	go w.loop(make(chan calloutJob, 1), j)
}

func (w *calloutWorkers) loop(c chan calloutJob, j calloutJob) {
	for {
		w.h.runCallout(j.in, j.id, j.c)
		w.mu.Lock()
		if w.closed || len(w.idle) >= maxIdleWorkers {
			w.mu.Unlock()
			return
		}
		w.idle = append(w.idle, c)
		w.mu.Unlock()
		var ok bool
		if j, ok = <-c; !ok {
			return // the host closed
		}
	}
}

// close ends the idle workers; busy ones end after their call-out.
func (w *calloutWorkers) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, c := range w.idle {
		close(c)
	}
	w.idle = nil
}

// callout is a proxy_http_call on its way: for a plain-HTTP cluster, sent
// by the host's own HTTP/1.1 client (h1); for a handler that is an
// inproc.Server, answered from its bytes (inproc); otherwise by
// Options.HTTPClient or net/http (req). The ways are values, not pointers:
// a call-out is one allocation.
type callout struct {
	cluster *cluster
	kind    calloutKind
	h1      h1Request
	inproc  inprocCall
	req     *http.Request
	timeout time.Duration // 0: none
}

// calloutKind is how a call-out is sent.
type calloutKind uint8

const (
	viaClient calloutKind = iota // req, by Options.HTTPClient or net/http
	viaH1                        // h1
	viaInproc                    // inproc
)

// release returns what the call-out borrowed, once it is sent or dropped.
func (c *callout) release() {
	if c.h1.buf != nil {
		calloutBuffers.Put(c.h1.buf)
		c.h1.buf, c.h1.raw = nil, nil
	}
	if c.inproc.buf != nil {
		calloutBuffers.Put(c.inproc.buf)
		c.inproc.buf, c.inproc.req = nil, inproc.Request{}
	}
}

func (h *Host) runCallout(in *instance, id uint32, c *callout) {
	defer h.wg.Done()
	resp := h.fetch(c)
	if h.closed.Load() {
		return
	}
	v := in.vm
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.inst != in || in.dead {
		return // the VM that asked has failed
	}
	in.callResp = resp
	in.effective = in.rootID
	_, err := in.call(in.onHTTPCallResponse, uint64(in.rootID), uint64(id),
		uint64(len(resp.headers)), uint64(len(resp.body)), 0)
	in.callResp = nil
	if err != nil {
		v.fail(in, err)
	}
}

// maxClusterRequests is Envoy's default circuit breaker of a cluster
// (max_requests and max_pending_requests, 1024): a call-out beyond it
// overflows.
const maxClusterRequests = 1024

// fetch performs a call-out and reports its outcome as Envoy's async HTTP
// client does. What goes wrong before a response starts is answered by
// Envoy's router as a local reply, which reaches the plugin as an ordinary
// response: 503 for a connection failure or an overflow, 504 for a
// timeout. A reset after the response started, or a body larger than the
// client takes, is a failure: the plugin sees no headers and
// proxy_get_status gives BrokenConnection "reset" (Envoy's
// Context::onHttpCallFailure).
func (h *Host) fetch(c *callout) *calloutResponse {
	defer c.release()
	inflight := &c.cluster.inflight
	if inflight.Add(1) > maxClusterRequests {
		inflight.Add(-1)
		r := localCalloutReply(http.StatusServiceUnavailable, resetBefore+"overflow")
		r.headers.Add("x-envoy-overloaded", "true")
		return r
	}
	defer inflight.Add(-1)
	switch c.kind {
	case viaH1:
		return h.fetchH1(c)
	case viaInproc:
		if c.timeout > 0 {
			c.inproc.req.Deadline = time.Now().Add(c.timeout)
		}
		return h.serveCallout(c.cluster, &c.inproc)
	}
	ctx, cancel := h.ctx, context.CancelFunc(func() {})
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(h.ctx, c.timeout)
	}
	defer cancel()
	req := c.req.WithContext(ctx)
	if c.cluster.handler != nil {
		return h.serveInProcess(c.cluster, req)
	}
	res, err := h.client.Do(req)
	if err != nil {
		if req.Context().Err() != nil && !errors.Is(err, context.DeadlineExceeded) {
			return &calloutResponse{failed: true} // the host is closing
		}
		return failedBeforeResponse(err, errors.Is(err, context.DeadlineExceeded))
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, h.opts.MaxCalloutBody+1))
	if err != nil || int64(len(body)) > h.opts.MaxCalloutBody {
		// A reset (or the timeout) after the headers came, or a body over
		// the limit (Envoy's ExceedResponseBufferLimit).
		return &calloutResponse{failed: true}
	}
	hm := make(fields.Map, 0, len(res.Header)+1)
	hm = append(hm, [2]string{":status", statusString(res.StatusCode)})
	for k, vs := range res.Header {
		for _, v := range vs {
			hm.Add(k, v)
		}
	}
	return &calloutResponse{headers: hm, body: body}
}

// fetchH1 is fetch through the host's HTTP/1.1 client.
func (h *Host) fetchH1(c *callout) *calloutResponse {
	r := &c.h1
	if c.timeout > 0 {
		r.deadline = time.Now().Add(c.timeout)
	}
	if !r.valid {
		// What net/http refuses to send fails as a refused connection would.
		return failedBeforeResponse(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false)
	}
	res, started, err := h.h1.do(r, h.opts.MaxCalloutBody)
	switch {
	case err == nil:
		return res
	case started || errors.Is(err, errHostClosed) || h.closed.Load():
		return &calloutResponse{failed: true}
	}
	var ne net.Error
	return failedBeforeResponse(err, errors.As(err, &ne) && ne.Timeout())
}

// failedBeforeResponse is what Envoy's router answers when a call-out gets
// no response (UpstreamFailure).
func failedBeforeResponse(err error, timeout bool) *calloutResponse {
	l, _ := UpstreamFailure(err, timeout)
	return localCalloutReply(l.Status, string(l.Body))
}

// localCalloutReply is a reply of Envoy's router in place of the upstream's.
func localCalloutReply(status int, body string) *calloutResponse {
	return &calloutResponse{
		headers: fields.Map{{":status", statusString(status)}, {"content-length", strconv.Itoa(len(body))}, {"content-type", "text/plain"}},
		body:    []byte(body),
	}
}

// NewTransport is an HTTP transport for call-outs and for a gateway's
// upstream: it keeps enough idle connections per host for a busy proxy, so
// that in steady state no request opens a connection (Go's default keeps
// two, and every request beyond them would dial and close one).
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0 // no limit across hosts
	t.MaxIdleConnsPerHost = 1024
	return t
}
