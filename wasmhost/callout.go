package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// httpCall implements proxy_http_call as Envoy's Context::httpCall: an
// unknown cluster or a request without :method, :path and :authority is a
// BadArgument; otherwise the request goes to the cluster's base URL from a
// goroutine, and its outcome (see fetch) is delivered to
// proxy_on_http_call_response on the root context of the dispatching VM.
func (h *Host) httpCall(in *instance, m api.Memory, p []uint64) Status {
	name, ok1 := readString(m, u32(p, 0), u32(p, 1))
	hb, ok2 := read(m, u32(p, 2), u32(p, 3))
	body, ok3 := read(m, u32(p, 4), u32(p, 5))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	base, known := h.opts.Clusters[name]
	if !known {
		return StatusBadArgument // Envoy: cluster not found
	}
	hm, err := fields.Parse(hb)
	if err != nil {
		return StatusBadArgument
	}
	method, ok1 := hm.Get(":method")
	path, ok2 := hm.Get(":path")
	authority, ok3 := hm.Get(":authority")
	if !ok1 || !ok2 || !ok3 {
		return StatusBadArgument
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+path, bytes.NewReader(append([]byte(nil), body...)))
	if err != nil {
		return StatusBadArgument
	}
	req.Host = authority
	for _, kv := range hm {
		if !strings.HasPrefix(kv[0], ":") {
			req.Header.Add(kv[0], kv[1])
		}
	}
	in.nextCallID++
	id := in.nextCallID
	if !m.WriteUint32Le(u32(p, 9), id) {
		return StatusInvalidMemoryAccess
	}
	timeout := time.Duration(u32(p, 8)) * time.Millisecond
	h.wg.Add(1)
	go h.runCallout(in, id, name, req, timeout)
	return StatusOK
}

func (h *Host) runCallout(in *instance, id uint32, cluster string, req *http.Request, timeout time.Duration) {
	defer h.wg.Done()
	ctx, cancel := h.ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(h.ctx, timeout)
	}
	resp := h.fetch(cluster, req.WithContext(ctx))
	cancel()
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
func (h *Host) fetch(cluster string, req *http.Request) *calloutResponse {
	inflight := h.inflight(cluster)
	if inflight.Add(1) > maxClusterRequests {
		inflight.Add(-1)
		r := localCalloutReply(http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: overflow")
		r.headers.Add("x-envoy-overloaded", "true")
		return r
	}
	defer inflight.Add(-1)
	res, err := h.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return localCalloutReply(http.StatusGatewayTimeout, "upstream request timeout")
		}
		if req.Context().Err() != nil {
			return &calloutResponse{failed: true} // the host is closing
		}
		errno := int(syscall.ECONNREFUSED)
		var se syscall.Errno
		if errors.As(err, &se) {
			errno = int(se)
		}
		return localCalloutReply(http.StatusServiceUnavailable,
			"upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: "+strconv.Itoa(errno))
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, h.opts.MaxCalloutBody+1))
	if err != nil || int64(len(body)) > h.opts.MaxCalloutBody {
		// A reset (or the timeout) after the headers came, or a body over
		// the limit (Envoy's ExceedResponseBufferLimit).
		return &calloutResponse{failed: true}
	}
	hm := make(fields.Map, 0, len(res.Header)+1)
	hm = append(hm, [2]string{":status", strconv.Itoa(res.StatusCode)})
	for k, vs := range res.Header {
		for _, v := range vs {
			hm.Add(k, v)
		}
	}
	return &calloutResponse{headers: hm, body: body}
}

// localCalloutReply is a reply of Envoy's router in place of the upstream's.
func localCalloutReply(status int, body string) *calloutResponse {
	return &calloutResponse{
		headers: fields.Map{{":status", strconv.Itoa(status)}, {"content-length", strconv.Itoa(len(body))}, {"content-type", "text/plain"}},
		body:    []byte(body),
	}
}

// inflight returns the counter of call-outs in flight to cluster.
func (h *Host) inflight(cluster string) *atomic.Int64 {
	h.inflightMu.Lock()
	defer h.inflightMu.Unlock()
	c, ok := h.inflightByCluster[cluster]
	if !ok {
		c = new(atomic.Int64)
		h.inflightByCluster[cluster] = c
	}
	return c
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
