package wasmhost

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// httpCall implements proxy_http_call: the request goes to the cluster's
// base URL from a goroutine, and the answer (or the failure, as a response
// with no headers) is delivered to proxy_on_http_call_response on the root
// context of the dispatching VM.
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
	go h.runCallout(in, id, req, timeout)
	return StatusOK
}

func (h *Host) runCallout(in *instance, id uint32, req *http.Request, timeout time.Duration) {
	defer h.wg.Done()
	ctx, cancel := h.ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(h.ctx, timeout)
	}
	resp := h.fetch(req.WithContext(ctx))
	cancel()
	if h.closed.Load() {
		return
	}
	v := in.vm
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.inst != in || in.dead {
		return // the VM that asked is gone
	}
	in.callResp = resp
	in.effective = in.rootID
	_, err := in.call(in.onHTTPCallResponse, uint64(in.rootID), uint64(id),
		uint64(len(resp.headers)), uint64(len(resp.body)), 0)
	in.callResp = nil
	if err != nil {
		_ = v.crash(in, err)
	}
}

// fetch performs the call-out. A failure yields a response with no headers
// and no body, which is how Envoy reports it to the plugin.
func (h *Host) fetch(req *http.Request) *calloutResponse {
	failed := &calloutResponse{}
	res, err := h.client.Do(req)
	if err != nil {
		return failed
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, h.opts.MaxCalloutBody+1))
	if err != nil || int64(len(body)) > h.opts.MaxCalloutBody {
		return failed
	}
	hm := make(fields.Map, 0, len(res.Header)+1)
	hm = append(hm, [2]string{":status", strconv.Itoa(res.StatusCode)})
	for k, vs := range res.Header {
		for _, v := range vs {
			hm.Add(k, v)
		}
	}
	return &calloutResponse{headers: hm, body: body, status: uint32(res.StatusCode)}
}
