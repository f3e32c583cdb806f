package wasmhost

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// RequestInfo describes a downstream request.
type RequestInfo struct {
	Method string
	Path   string // request target, query included
	Host   string // :authority
	Scheme string // default "http"
	// Headers are the regular request headers; the pseudo headers are
	// added from the fields above.
	Headers       [][2]string
	SourceAddress string // client "ip:port"
	RequestID     string // property request.id and header x-request-id when set
	ConnectionID  uint64 // property connection.id; 0 picks a fresh one
	Protocol      string // property request.protocol, default "HTTP/1.1"
	EndOfStream   bool   // the request has no body
	// PeerCertificate is the client's certificate the listener verified
	// (mutual TLS), for the connection.*_peer_certificate properties;
	// nil for none.
	PeerCertificate *x509.Certificate
}

// LocalResponse is an answer the plugin sent instead of the upstream's.
type LocalResponse struct {
	Status  int
	Details string // Envoy's response code details
	Headers [][2]string
	Body    []byte
	// GrpcStatus is the gRPC status the plugin gave for a gRPC request
	// (proxy_send_local_response's grpc_status), from 0 to 16; any other
	// value (the host's -1) is none, and Middleware's answer to a gRPC
	// request maps Status instead, as Envoy does.
	GrpcStatus int32
}

// Result is the outcome of a header callback: either the stream continues
// with Headers (pseudo headers included, as the plugin left them; Modified
// says whether it changed any), or the plugin answered with Local. Headers
// is the stream's own map, not to be modified.
type Result struct {
	Headers  [][2]string
	Modified bool
	Local    *LocalResponse
}

// Get returns the first value of a header of the result (names are lower-case).
func (r Result) Get(name string) (string, bool) { return fields.Map(r.Headers).Get(name) }

// Stream is one HTTP request/response pair in a plugin context. Its methods
// are called in order by one goroutine: RequestHeaders, then optionally
// ResponseHeaders and ResponseBody for each part of the body, then Close.
type Stream struct {
	h    *Host
	vm   *vm
	info RequestInfo

	// Guarded by vm.mu.
	inst      *instance // where the context lives; nil until RequestHeaders
	id        uint32
	req, resp fields.Map
	respPhase bool
	// reqOpen and respOpen: the plugin can reach the request or the
	// response headers now (Envoy's request_headers_ and
	// response_headers_ are set).
	reqOpen, respOpen bool
	// reqModified and respModified: the plugin changed those headers.
	reqModified, respModified bool
	local                     *LocalResponse
	localPending              bool // sent by the plugin, not yet through its response callback
	resumed                   bool
	failed                    error // errVMFailed: answer by the failure policy
	done                      bool
	pendingDel                bool          // proxy_on_done returned false; deleted on proxy_done
	wake                      chan struct{} // made when the stream first waits: most never do
	connID                    uint64
	rw                        responseWriter // Middleware's, kept with a pooled stream
}

// NewStream binds a request to a worker VM, round robin. Call Close when done.
func (h *Host) NewStream(ctx context.Context, info RequestInfo) *Stream {
	s := &Stream{}
	s.start(h, info, len(info.Headers))
	for _, p := range info.Headers {
		s.req.Add(p[0], p[1])
	}
	s.addRequestID()
	return s
}

// start binds s to a worker VM, round robin, and gives it the request's
// pseudo headers; the regular ones (room for n) follow, then
// addRequestID.
func (s *Stream) start(h *Host, info RequestInfo, n int) {
	if info.Scheme == "" {
		info.Scheme = "http"
	}
	if info.Protocol == "" {
		info.Protocol = "HTTP/1.1"
	}
	s.h, s.vm, s.info = h, h.pick(), info
	s.connID = info.ConnectionID
	if s.connID == 0 {
		s.connID = h.connID.Add(1)
	}
	s.req = slices.Grow(s.req[:0], n+5)
	s.req = append(s.req, [2]string{":authority", info.Host}, [2]string{":path", info.Path},
		[2]string{":method", info.Method}, [2]string{":scheme", info.Scheme})
}

// addRequestID adds x-request-id from RequestInfo.RequestID when the
// request has none.
func (s *Stream) addRequestID() {
	if s.info.RequestID != "" {
		if _, ok := s.req.Get("x-request-id"); !ok {
			s.req = append(s.req, [2]string{"x-request-id", s.info.RequestID})
		}
	}
}

// streamPool keeps the streams of Middleware, with their header maps'
// arrays: a request through the gateway allocated a stream, two maps, a
// writer and the slices they were built from, most of what the plugin
// cost it in garbage. Only Middleware recycles, since it alone knows no
// Result of the stream is held after Close.
var streamPool sync.Pool

// pooledStream returns a stream from the pool, or a new one.
func pooledStream() *Stream {
	if s, ok := streamPool.Get().(*Stream); ok {
		return s
	}
	return &Stream{}
}

// maxHeldPart bounds the buffer for a body's last part that a pooled
// stream keeps.
const maxHeldPart = 64 << 10

// recycle returns s to the pool, the arrays of its maps kept, emptied.
// Only for a stream whose close deleted its context: nothing in the host
// reaches it any more.
func (s *Stream) recycle() {
	clear(s.req)
	clear(s.resp)
	req, resp, wake, held := s.req[:0], s.resp[:0], s.wake, s.rw.held[:0]
	if wake != nil {
		select { // a signal nobody waited for
		case <-wake:
		default:
		}
	}
	if cap(held) > maxHeldPart {
		held = nil // one large body's part is not kept for every request
	}
	*s = Stream{req: req, resp: resp, wake: wake}
	s.rw.held = held
	streamPool.Put(s)
}

// fail ends a stream from outside (VM crash, host close). vm.mu is held.
func (s *Stream) fail(err error) {
	if s.failed == nil {
		s.failed = err
	}
	s.signal()
}

func (s *Stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// RequestHeaders runs proxy_on_context_create and proxy_on_request_headers.
// When the plugin pauses, it waits (without holding the VM) until the
// plugin resumes the request or answers it, or ctx ends. A VM that has
// failed answers as Options.FailurePolicy says. While it waits, it sends
// the first call-out the callback dispatched, if that has a timeout, and
// runs the plugin's callback with its answer; it sees ctx end once that
// call-out has ended, within its timeout.
func (s *Stream) RequestHeaders(ctx context.Context) (Result, error) {
	v := s.vm
	v.mu.Lock()
	in, err := v.live()
	if err != nil {
		v.mu.Unlock()
		return Result{}, err
	}
	if in == nil {
		r := s.h.failedResult(s.reqHeaders)
		v.mu.Unlock()
		return r, nil
	}
	s.inst, s.id = in, in.newContextID()
	in.streams[s.id] = s
	if _, err := in.call(in.onContextCreate, uint64(s.id), uint64(in.rootID)); err != nil {
		v.fail(in, err)
		return s.await(ctx, actionPause, s.reqHeaders, calloutJob{})
	}
	in.effective = s.id
	s.reqOpen = true
	action, job, err := in.headerCallback(in.onRequestHeaders, uint64(s.id), uint64(len(s.req)), b2u(s.info.EndOfStream))
	if err != nil {
		v.fail(in, err)
	} else if uint32(action) == actionContinue {
		s.reqOpen = false
	}
	return s.await(ctx, uint32(action), s.reqHeaders, job)
}

// ResponseHeaders runs proxy_on_response_headers with the upstream status
// and headers, a body to follow (ResponseBody). The result's headers
// include ":status".
func (s *Stream) ResponseHeaders(ctx context.Context, status int, headers [][2]string) (Result, error) {
	if err := s.openResponse(status, len(headers)); err != nil {
		return Result{}, err
	}
	for _, p := range headers {
		s.resp.Add(p[0], p[1])
	}
	return s.responseHeaders(ctx, false)
}

// errBodyHeld: the plugin asked to hold a response body.
var errBodyHeld = errors.New("wasmhost: proxy_on_response_body did not continue; this host only lets a body pass")

// ResponseBody runs proxy_on_response_body with the next part of the
// response body, which the plugin reads as the buffer HttpResponseBody
// during the call; endOfStream: it is the last (it may be empty). Call it
// after ResponseHeaders, for each part as it passes. The plugin may read
// the body, not hold or change it: an action other than Continue is an
// error.
func (s *Stream) ResponseBody(part []byte, endOfStream bool) error {
	v := s.vm
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	in := s.inst
	if s.failed != nil || s.local != nil || in.dead || v.inst != in || in.onResponseBody == nil {
		return nil // nothing to run it: the stream failed, was answered, or the plugin reads no body
	}
	in.effective = s.id
	in.respBody, in.inRespBody = part, true
	action, err := in.call(in.onResponseBody, uint64(s.id), uint64(len(part)), b2u(endOfStream))
	in.respBody, in.inRespBody = nil, false
	if err != nil {
		v.fail(in, err)
		return nil // the VM failed; the response already passed
	}
	if uint32(action) != actionContinue {
		return fmt.Errorf("%w (action %d)", errBodyHeld, action)
	}
	return nil
}

// openResponse takes the VM and starts the stream's response map with
// :status, room for n headers to follow; for a stream that cannot take a
// callback it releases the VM and says why.
func (s *Stream) openResponse(status, n int) error {
	s.vm.mu.Lock()
	if err := s.usable(); err != nil {
		s.vm.mu.Unlock()
		return err
	}
	s.resp = append(slices.Grow(s.resp[:0], n+1), [2]string{":status", statusString(status)})
	return nil
}

// responseHeaders runs proxy_on_response_headers with s.resp, on a usable
// stream; endOfStream: no body follows. It is entered with vm.mu held and
// returns with it released.
func (s *Stream) responseHeaders(ctx context.Context, endOfStream bool) (Result, error) {
	v := s.vm
	in := s.inst
	s.respPhase, s.resumed, s.reqOpen = true, false, false
	if in.dead || v.inst != in {
		s.failed = errVMFailed // the VM failed since the request
		return s.await(ctx, actionPause, s.respHeaders, calloutJob{})
	}
	in.effective = s.id
	s.respOpen = true
	action, job, err := in.headerCallback(in.onResponseHeaders, uint64(s.id), uint64(len(s.resp)), b2u(endOfStream))
	if err != nil {
		v.fail(in, err)
	}
	s.respOpen = false
	return s.await(ctx, uint32(action), s.respHeaders, job)
}

// statusString is code as :status carries it, without formatting the
// common ones.
func statusString(code int) string {
	switch code {
	case 200:
		return "200"
	case 201:
		return "201"
	case 204:
		return "204"
	case 301:
		return "301"
	case 302:
		return "302"
	case 304:
		return "304"
	case 400:
		return "400"
	case 401:
		return "401"
	case 403:
		return "403"
	case 404:
		return "404"
	case 429:
		return "429"
	case 500:
		return "500"
	case 502:
		return "502"
	case 503:
		return "503"
	case 504:
		return "504"
	}
	return strconv.Itoa(code)
}

// usable reports why the stream cannot take a callback. vm.mu is held.
func (s *Stream) usable() error {
	switch {
	case s.failed != nil && !errors.Is(s.failed, errVMFailed):
		return s.failed
	case s.inst == nil && s.failed == nil:
		return errNoContext
	}
	return nil
}

// failedResult is what a request gets from a failed VM: with FailOpen it
// goes on untouched; otherwise Envoy's failStream answers 503 with no body.
func (h *Host) failedResult(headers func() fields.Map) Result {
	if h.opts.FailurePolicy == FailOpen {
		return Result{Headers: headers()}
	}
	return Result{Local: &LocalResponse{Status: 503, Details: "wasm_fail_stream", GrpcStatus: grpcUnavailable}}
}

// await finishes a header callback that returned action, sending the
// call-out job (if its c is set) the plugin dispatched in it: on this
// goroutine if the stream waits, as Envoy's worker thread serves both the
// stream and its plugin's call-outs; by a worker otherwise. A call-out
// handed to a worker and answered there cost a wake-up of the worker, one
// of this goroutine, and the plugin's memory moving between CPUs, more
// than the plugin's own code for the request (BenchmarkWasm/c-call-out).
// It is entered with vm.mu held and returns with it released.
func (s *Stream) await(ctx context.Context, action uint32, headers func() fields.Map, job calloutJob) (Result, error) {
	v := s.vm
	defer func() {
		if job.c != nil {
			s.h.workers.run(job) // the stream did not wait
		}
	}()
	for {
		switch {
		case errors.Is(s.failed, errVMFailed):
			r := s.h.failedResult(headers)
			v.mu.Unlock()
			return r, nil
		case s.failed != nil:
			err := s.failed
			v.mu.Unlock()
			return Result{}, err
		case s.local != nil:
			l := s.local
			v.mu.Unlock()
			return Result{Local: l}, nil
		case (action == actionContinue || s.resumed) && !s.localPending:
			s.resumed = false
			r := Result{Headers: headers(), Modified: s.reqModified}
			if s.respPhase {
				r.Modified = s.respModified
			}
			v.mu.Unlock()
			return r, nil
		}
		if job.c != nil {
			v.mu.Unlock()
			j := job
			job = calloutJob{}
			s.h.runCallout(j.in, j.id, j.c)
			if err := ctx.Err(); err != nil {
				return Result{}, err // it ended while the call-out was out
			}
			v.mu.Lock()
			continue
		}
		if s.wake == nil {
			s.wake = make(chan struct{}, 1) // signals before it existed are in the state checked above
		}
		v.mu.Unlock()
		select {
		case <-s.wake:
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
		v.mu.Lock()
	}
}

// sendLocal sends the local reply the plugin asked for, once its callback
// has returned, as Envoy's sendLocalReply does: the reply's headers are
// ":status", the plugin's headers, then content-length and a text/plain
// content-type when the body is not empty and none was given
// (Http::Utility::prepareLocalReply), and they go through the plugin's own
// proxy_on_response_headers, since the reply passes the encoder filters,
// this one included. vm.mu is held.
func (s *Stream) sendLocal(l *LocalResponse) {
	s.localPending = false
	in := s.inst
	if s.respPhase || in.dead {
		// Sent from the response callback itself: it is not run again.
		s.local = l
		s.signal()
		return
	}
	hm := make(fields.Map, 0, len(l.Headers)+3)
	hm = append(hm, [2]string{":status", statusString(l.Status)})
	for _, kv := range l.Headers {
		hm.Add(kv[0], kv[1])
	}
	if len(l.Body) > 0 {
		hm.Replace("content-length", strconv.Itoa(len(l.Body)))
		if _, ok := hm.Get("content-type"); !ok {
			hm.Add("content-type", "text/plain")
		}
	} else {
		hm.Remove("content-length")
		hm.Remove("content-type")
	}
	s.resp, s.respPhase, s.reqOpen, s.respOpen = hm, true, false, true
	in.effective = s.id
	_, err := in.call(in.onResponseHeaders, uint64(s.id), uint64(len(hm)), b2u(len(l.Body) == 0))
	s.respOpen = false
	if err != nil {
		in.vm.fail(in, err)
		return
	}
	out := &LocalResponse{Status: l.Status, Details: l.Details, Body: l.Body, GrpcStatus: l.GrpcStatus,
		Headers: make([][2]string, 0, len(s.resp))}
	for _, kv := range s.resp {
		if kv[0] == ":status" {
			if n, err := strconv.Atoi(kv[1]); err == nil {
				out.Status = n
			}
			continue
		}
		out.Headers = append(out.Headers, kv)
	}
	s.local = out
	s.signal()
}

// Close ends the stream: proxy_on_done, proxy_on_log and proxy_on_delete.
// It is safe to call more than once and after failures.
func (s *Stream) Close() { s.close() }

// close is Close; it reports whether this call deleted the stream's
// context, after which nothing in the host reaches the stream (a context
// a plugin keeps with proxy_on_done returning false, or one of a failed
// VM, is not).
func (s *Stream) close() (deleted bool) {
	v := s.vm
	v.mu.Lock()
	defer v.mu.Unlock()
	if s.done {
		return false
	}
	s.done = true
	in := s.inst
	if in == nil || in.dead || v.inst != in {
		return false
	}
	in.effective = s.id
	ok, err := in.call(in.onDone, uint64(s.id))
	if err != nil {
		v.fail(in, err)
		return false
	}
	if in.onDone != nil && uint32(ok) == 0 {
		s.pendingDel = true // proxy_done finishes it
		return false
	}
	return in.finish(s)
}

// finish runs proxy_on_log and proxy_on_delete, and reports whether the
// context was deleted (the VM did not fail). vm.mu is held.
func (in *instance) finish(s *Stream) bool {
	v := in.vm
	in.effective = s.id
	s.reqOpen, s.respOpen = false, false
	if _, err := in.call(in.onLog, uint64(s.id)); err != nil {
		v.fail(in, err)
		return false
	}
	if _, err := in.call(in.onDelete, uint64(s.id)); err != nil {
		v.fail(in, err)
		return false
	}
	delete(in.streams, s.id)
	in.effective = in.rootID
	return true
}

// property returns a stream property serialized as Envoy does: strings as
// raw bytes, integers as 8 little-endian bytes.
func (s *Stream) property(path string) ([]byte, bool) {
	i := &s.info
	switch path {
	case "source.address":
		return []byte(i.SourceAddress), i.SourceAddress != ""
	case "source.port":
		_, port, err := net.SplitHostPort(i.SourceAddress)
		if err != nil {
			return nil, false
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, false
		}
		return le64(n), true
	case "request.path":
		p, _ := s.req.Get(":path")
		return []byte(p), true
	case "request.url_path":
		p, _ := s.req.Get(":path")
		for j := 0; j < len(p); j++ {
			if p[j] == '?' {
				p = p[:j]
				break
			}
		}
		return []byte(p), true
	case "request.method":
		m, _ := s.req.Get(":method")
		return []byte(m), true
	case "request.host":
		a, _ := s.req.Get(":authority")
		return []byte(a), true
	case "request.scheme":
		return []byte(i.Scheme), true
	case "request.id":
		return []byte(i.RequestID), i.RequestID != ""
	case "request.protocol":
		return []byte(i.Protocol), true
	case "connection.id":
		return le64(s.connID), true
	case "connection.uri_san_peer_certificate":
		// The first URI, and none without one, as Envoy's
		// SslExtractorsValues (source/extensions/filters/common/expr/context.cc).
		if c := i.PeerCertificate; c != nil && len(c.URIs) > 0 {
			return []byte(c.URIs[0].String()), true
		}
	case "connection.dns_san_peer_certificate":
		if c := i.PeerCertificate; c != nil && len(c.DNSNames) > 0 {
			return []byte(c.DNSNames[0]), true
		}
	case "response.code":
		if st, ok := s.resp.Get(":status"); ok {
			n, _ := strconv.ParseUint(st, 10, 32)
			return le64(n), true
		}
	}
	return nil, false
}

func le64(n uint64) []byte {
	b := make([]byte, 8)
	for j := range b {
		b[j] = byte(n >> (8 * j))
	}
	return b
}

const (
	actionContinue = 0
	actionPause    = 1
)

// reqHeaders and respHeaders are the headers as they are when called (a
// method value such as s.req.Clone would capture the slice too early). A
// result shares them with the stream rather than copying them for every
// request: once its phase is over no callback can change them (Envoy's
// Context::getMap refuses a map outside its phase, headerMap here).
func (s *Stream) reqHeaders() fields.Map  { return s.req }
func (s *Stream) respHeaders() fields.Map { return s.resp }

// newContextID returns the id of a new stream context. As cpp-host's
// (WasmBase::allocContextId in src/wasm.cc), ids count up and wrap past
// the largest to 0, skipping those still in use: the root's and live
// streams'.
func (in *instance) newContextID() uint32 {
	for {
		id := in.nextID
		in.nextID++
		if _, live := in.streams[id]; !live && id != in.rootID {
			return id
		}
	}
}
