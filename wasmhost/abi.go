package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

var errNoContext = errors.New("wasmhost: the stream has no context yet (RequestHeaders not called)")

// ABI enumerations.
const (
	mapRequestHeaders   = 0
	mapRequestTrailers  = 1
	mapResponseHeaders  = 2
	mapResponseTrailers = 3
	mapCallRespHeaders  = 6
	mapCallRespTrailers = 7

	bufferRespBody     = 1
	bufferCallRespBody = 4
	bufferVMConfig     = 6
	bufferPluginConfig = 7

	mapMax = 7

	streamRequest    = 0
	streamResponse   = 1
	streamDownstream = 2
	streamUpstream   = 3
)

type hostFunc struct {
	name   string
	params int             // i32 parameters, or
	types  []api.ValueType // explicit types when not all i32
	fn     func(in *instance, m api.Memory, p []uint64) Status
}

// exportHostFunctions defines module "env" with every host function of ABI
// v0.2.1 that cpp-host registers (include/proxy-wasm/exports.h
// FOR_ALL_HOST_FUNCTIONS and the 0.2.1 additions, src/wasm.cc
// registerCallbacks), and the two Emscripten helpers it adds. Functions
// the host does not model answer UNIMPLEMENTED.
func (h *Host) exportHostFunctions(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	for _, f := range h.hostFuncs() {
		types := f.types
		if types == nil {
			types = make([]api.ValueType, f.params)
			for i := range types {
				types[i] = i32
			}
		}
		fn, name := f.fn, "env."+f.name
		h.provided[name] = true
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, st []uint64) {
			in, ok := instanceOf(ctx)
			if !ok || in.dead {
				panic(errVMFailed)
			}
			in.checkAllowed(name)
			if in.vm.h.opts.MeasureGuest && in.depth == 1 {
				start := time.Now()
				st[0] = uint64(fn(in, m.Memory(), st))
				in.hostNanos += time.Since(start).Nanoseconds() + in.vm.h.clockCost
				return
			}
			st[0] = uint64(fn(in, m.Memory(), st))
		}), types, []api.ValueType{i32}).Export(f.name)
	}
	// Emscripten's helpers, registered by cpp-host whatever the module.
	h.provided["env.emscripten_notify_memory_growth"] = true
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, _ []uint64) {
		if in, ok := instanceOf(ctx); ok {
			in.checkAllowed("env.emscripten_notify_memory_growth")
		}
	}), []api.ValueType{i32}, nil).Export("emscripten_notify_memory_growth")
	h.provided["env.pthread_equal"] = true
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, st []uint64) {
		if in, ok := instanceOf(ctx); ok {
			in.checkAllowed("env.pthread_equal")
		}
		st[0] = b2u(uint32(st[0]) == uint32(st[1]))
	}), []api.ValueType{i32, i32}, []api.ValueType{i32}).Export("pthread_equal")
	_, err := b.Instantiate(ctx)
	return err
}

func unimplemented(in *instance, m api.Memory, p []uint64) Status { return StatusUnimplemented }

// envoyDetails is response code details as Envoy stores them: whitespace
// becomes '_' (StringUtil::replaceAllEmptySpace).
// localHeaders parses the serialized headers of a local response. The
// last ones are kept: a refusal the plugin repeats for a client that keeps
// coming (its headers rendered once, with its over-limit cache entry) is
// parsed once, and its copy costs one allocation rather than two a
// header.
func (in *instance) localHeaders(hb []byte) (fields.Map, error) {
	if in.localMap == nil || !bytes.Equal(hb, in.localRaw) {
		hm, err := fields.Parse(hb)
		if err != nil || hm == nil {
			return hm, err
		}
		in.localRaw, in.localMap = append(in.localRaw[:0], hb...), hm
	}
	return in.localMap.Clone(), nil
}

func envoyDetails(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v' {
			return '_'
		}
		return r
	}, s)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func u32(p []uint64, i int) uint32 { return uint32(p[i]) }

func read(m api.Memory, ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	return m.Read(ptr, size)
}

func readString(m api.Memory, ptr, size uint32) (string, bool) {
	b, ok := read(m, ptr, size)
	return string(b), ok
}

func (h *Host) hostFuncs() []hostFunc {
	return []hostFunc{
		{"proxy_log", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			msg, ok := readString(m, u32(p, 1), u32(p, 2))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			if in.inConfigure && LogLevel(u32(p, 0)) >= LogLevelWarn {
				in.configErrLog = msg
			}
			h.log(in.vm.idx, LogLevel(u32(p, 0)), msg)
			return StatusOK
		}},
		{"proxy_get_log_level", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			if !m.WriteUint32Le(u32(p, 0), uint32(h.opts.LogLevel)) {
				return StatusInvalidMemoryAccess
			}
			return StatusOK
		}},
		{"proxy_get_current_time_nanoseconds", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			if !m.WriteUint64Le(u32(p, 0), uint64(h.opts.Now().UnixNano())) {
				return StatusInvalidMemoryAccess
			}
			return StatusOK
		}},
		// Any context may set the timer; it is its root context's
		// (cpp-host ContextBase::setTimerPeriod).
		{"proxy_set_tick_period_milliseconds", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			in.setTick(time.Duration(u32(p, 0)) * time.Millisecond)
			return StatusOK
		}},
		{"proxy_set_effective_context", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			id := u32(p, 0)
			if _, ok := in.streams[id]; !ok && id != in.rootID {
				return StatusBadArgument
			}
			in.effective = id
			return StatusOK
		}},
		{"proxy_done", 0, nil, func(in *instance, m api.Memory, p []uint64) Status {
			s := in.streams[in.effective]
			if s == nil || !s.pendingDel {
				return StatusNotFound
			}
			s.pendingDel = false
			in.finish(s)
			return StatusOK
		}},
		{"proxy_get_buffer_status", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			b, st := in.buffer(u32(p, 0))
			if st != StatusOK {
				return st
			}
			if !m.WriteUint32Le(u32(p, 1), uint32(len(b))) || !m.WriteUint32Le(u32(p, 2), 0) {
				return StatusInvalidMemoryAccess
			}
			return StatusOK
		}},
		{"proxy_get_buffer_bytes", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			b, st := in.buffer(u32(p, 0))
			if st != StatusOK {
				return st
			}
			start, max := uint64(u32(p, 1)), uint64(u32(p, 2))
			if start > uint64(len(b)) {
				return StatusBadArgument
			}
			end := min(start+max, uint64(len(b)))
			return in.give(b[start:end], u32(p, 3), u32(p, 4))
		}},
		{"proxy_set_buffer_bytes", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			if _, st := in.buffer(u32(p, 0)); st != StatusOK {
				return st
			}
			return StatusUnimplemented // bodies and configurations are read-only here
		}},
		// The size is Envoy's HeaderMap::byteSize, the names' and values'
		// bytes, not the size of the serialized map.
		{"proxy_get_header_map_size", 2, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			if st != StatusOK {
				return st
			}
			n := 0
			for _, kv := range *hm {
				n += len(kv[0]) + len(kv[1])
			}
			if !m.WriteUint32Le(u32(p, 1), uint32(n)) {
				return StatusInvalidMemoryAccess
			}
			return StatusOK
		}},
		// A map that is not available reads as empty (Envoy's
		// headerMapToPairs of a null map).
		{"proxy_get_header_map_pairs", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			switch st {
			case StatusOK:
				in.buf = hm.Append(in.buf[:0])
			case StatusBadArgument:
				if u32(p, 0) > mapMax {
					return st
				}
				in.buf = in.buf[:0]
			default:
				return st
			}
			return in.give(in.buf, u32(p, 1), u32(p, 2))
		}},
		{"proxy_set_header_map_pairs", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			if st != StatusOK {
				return st
			}
			if !in.writable(u32(p, 0)) {
				return StatusBadArgument
			}
			b, ok := read(m, u32(p, 1), u32(p, 2))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			nm, err := fields.Parse(b)
			if err != nil {
				return StatusBadArgument
			}
			*hm = nm
			in.markModified(u32(p, 0))
			return StatusOK
		}},
		{"proxy_get_header_map_value", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			if st != StatusOK {
				return st
			}
			key, ok := read(m, u32(p, 1), u32(p, 2))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			for _, kv := range *hm {
				if strings.EqualFold(kv[0], string(key)) {
					return in.giveString(kv[1], u32(p, 3), u32(p, 4))
				}
			}
			return StatusNotFound
		}},
		{"proxy_add_header_map_value", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			return in.mutateHeader(m, p, func(hm *fields.Map, k, v string) { hm.Add(k, v) })
		}},
		{"proxy_replace_header_map_value", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			return in.mutateHeader(m, p, func(hm *fields.Map, k, v string) { hm.Replace(k, v) })
		}},
		{"proxy_remove_header_map_value", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			p = []uint64{p[0], p[1], p[2], 0, 0}
			return in.mutateHeader(m, p, func(hm *fields.Map, k, _ string) { hm.Remove(k) })
		}},
		{"proxy_continue_stream", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			return in.continueStream(u32(p, 0))
		}},
		// Envoy's Context::closeStream: a reset after the VM call returns;
		// the network stream types mean nothing to an HTTP filter.
		{"proxy_close_stream", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			t := u32(p, 0)
			if t > streamUpstream {
				return StatusBadArgument
			}
			if s := in.streams[in.effective]; s != nil && t <= streamResponse {
				in.defer_(func() { s.fail(ErrStreamReset) })
			}
			return StatusOK
		}},
		// Envoy's Context::sendLocalResponse: the reply is sent after the VM
		// call returns, through the encoder filters and so through this
		// plugin's own response callback (Stream.sendLocal). Without a
		// stream (the root context) there is nothing to answer, and Envoy
		// still says OK.
		{"proxy_send_local_response", 8, nil, func(in *instance, m api.Memory, p []uint64) Status {
			details, ok1 := readString(m, u32(p, 1), u32(p, 2))
			body, ok2 := read(m, u32(p, 3), u32(p, 4))
			hb, ok3 := read(m, u32(p, 5), u32(p, 6))
			if !ok1 || !ok2 || !ok3 {
				return StatusInvalidMemoryAccess
			}
			hm, err := in.localHeaders(hb)
			if err != nil {
				return StatusBadArgument
			}
			if s := in.streams[in.effective]; s != nil && s.local == nil && !s.localPending {
				s.localPending = true
				l := &LocalResponse{Status: int(u32(p, 0)), Details: envoyDetails(details), Headers: hm, Body: append([]byte{}, body...),
					GrpcStatus: int32(u32(p, 7))}
				in.defer_(func() { s.sendLocal(l) })
			}
			return StatusOK
		}},
		// The status of the root context: BrokenConnection and "reset" after
		// a call-out failed (Envoy's Context::onHttpCallFailure), 0 otherwise.
		{"proxy_get_status", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			var code uint32
			var msg string
			if r := in.callResp; r != nil && r.failed {
				code, msg = uint32(StatusBrokenConnection), "reset"
			}
			if !m.WriteUint32Le(u32(p, 0), code) {
				return StatusInvalidMemoryAccess
			}
			return in.giveString(msg, u32(p, 1), u32(p, 2))
		}},
		{"proxy_http_call", 10, nil, func(in *instance, m api.Memory, p []uint64) Status {
			return h.httpCall(in, m, p)
		}},
		{"proxy_get_property", 4, nil, func(in *instance, m api.Memory, p []uint64) Status {
			raw, ok := read(m, u32(p, 0), u32(p, 1))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			// Envoy's Context::getProperty splits the path at NUL bytes
			// only, so "source.address" is one unknown name there. The
			// host names its properties by their segments joined with
			// dots, so a path holding a dot names none of them.
			if bytes.IndexByte(raw, '.') >= 0 {
				return StatusNotFound
			}
			path := strings.ReplaceAll(string(raw), "\x00", ".")
			v, found := h.property(in, path)
			if !found {
				return StatusNotFound
			}
			return in.give(v, u32(p, 2), u32(p, 3))
		}},
		{"proxy_set_property", 4, nil, func(in *instance, m api.Memory, p []uint64) Status { return StatusNotFound }},
		{"proxy_get_shared_data", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			key, ok := read(m, u32(p, 0), u32(p, 1))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			v, cas, found := h.shared.getView(string(key))
			if !found {
				return StatusNotFound
			}
			if !m.WriteUint32Le(u32(p, 4), cas) {
				return StatusInvalidMemoryAccess
			}
			return in.give(v, u32(p, 2), u32(p, 3))
		}},
		{"proxy_set_shared_data", 5, nil, func(in *instance, m api.Memory, p []uint64) Status {
			key, ok1 := read(m, u32(p, 0), u32(p, 1))
			val, ok2 := read(m, u32(p, 2), u32(p, 3))
			if !ok1 || !ok2 {
				return StatusInvalidMemoryAccess
			}
			return h.shared.set(string(key), val, u32(p, 4))
		}},
		{"proxy_define_metric", 4, nil, func(in *instance, m api.Memory, p []uint64) Status {
			name, ok := readString(m, u32(p, 1), u32(p, 2))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			id, st := h.metrics.define(MetricType(u32(p, 0)), name)
			if st == StatusOK && !m.WriteUint32Le(u32(p, 3), id) {
				return StatusInvalidMemoryAccess
			}
			return st
		}},
		{"proxy_increment_metric", 0, []api.ValueType{api.ValueTypeI32, api.ValueTypeI64}, func(in *instance, m api.Memory, p []uint64) Status {
			return h.metrics.increment(u32(p, 0), int64(p[1]))
		}},
		{"proxy_record_metric", 0, []api.ValueType{api.ValueTypeI32, api.ValueTypeI64}, func(in *instance, m api.Memory, p []uint64) Status {
			return h.metrics.record(u32(p, 0), p[1])
		}},
		{"proxy_get_metric", 2, nil, func(in *instance, m api.Memory, p []uint64) Status {
			v, st := h.metrics.read(u32(p, 0))
			if st == StatusOK && !m.WriteUint64Le(u32(p, 1), v) {
				return StatusInvalidMemoryAccess
			}
			return st
		}},
		// Not modeled: gRPC, shared queues, foreign functions.
		{"proxy_grpc_call", 12, nil, unimplemented},
		{"proxy_grpc_stream", 9, nil, unimplemented},
		{"proxy_grpc_send", 4, nil, unimplemented},
		{"proxy_grpc_cancel", 1, nil, unimplemented},
		{"proxy_grpc_close", 1, nil, unimplemented},
		{"proxy_register_shared_queue", 3, nil, unimplemented},
		{"proxy_resolve_shared_queue", 5, nil, unimplemented},
		{"proxy_enqueue_shared_queue", 3, nil, unimplemented},
		{"proxy_dequeue_shared_queue", 3, nil, unimplemented},
		{"proxy_call_foreign_function", 6, nil, func(in *instance, m api.Memory, p []uint64) Status { return StatusNotFound }},
	}
}

func (in *instance) giveString(s string, retPtr, retSize uint32) Status {
	in.buf = append(in.buf[:0], s...)
	return in.give(in.buf, retPtr, retSize)
}

// buffer returns the buffer readable in the current callback.
func (in *instance) buffer(t uint32) ([]byte, Status) {
	switch t {
	case bufferVMConfig:
		if in.inVMStart {
			return in.vmConfig, StatusOK
		}
	case bufferPluginConfig:
		if in.inConfigure {
			return in.pluginConfig, StatusOK
		}
	case bufferCallRespBody:
		if in.callResp != nil {
			return in.callResp.body, StatusOK
		}
	case bufferRespBody:
		if in.inRespBody {
			return in.respBody, StatusOK
		}
	case 0, 2, 3, 5, 8: // request bodies, TCP data, gRPC, FFI: not modeled
	default:
		return nil, StatusBadArgument
	}
	return nil, StatusNotFound
}

// headerMap returns the map t of the effective context, or BadArgument
// when the map does not exist now, as Envoy's Context::getMap/getConstMap
// answer: request headers until the request continues, response headers
// during the response callback, call-out response headers during the
// call-out callback, and no trailers (the host passes none).
func (in *instance) headerMap(t uint32) (*fields.Map, Status) {
	s := in.streams[in.effective]
	switch t {
	case mapRequestHeaders:
		if s != nil && s.reqOpen {
			return &s.req, StatusOK
		}
	case mapResponseHeaders:
		if s != nil && s.respOpen {
			return &s.resp, StatusOK
		}
	case mapCallRespHeaders:
		if in.callResp != nil && !in.callResp.failed {
			return &in.callResp.headers, StatusOK
		}
	}
	return nil, StatusBadArgument
}

func (in *instance) writable(t uint32) bool {
	return t == mapRequestHeaders || t == mapResponseHeaders
}

func (in *instance) mutateHeader(m api.Memory, p []uint64, f func(hm *fields.Map, k, v string)) Status {
	t := u32(p, 0)
	hm, st := in.headerMap(t)
	if st != StatusOK {
		return st
	}
	if !in.writable(t) {
		return StatusBadArgument
	}
	kb, ok1 := read(m, u32(p, 1), u32(p, 2))
	v, ok2 := readString(m, u32(p, 3), u32(p, 4))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	f(hm, lowerString(kb), v)
	in.markModified(t)
	return StatusOK
}

// markModified notes that the plugin changed header map t of the
// effective stream.
func (in *instance) markModified(t uint32) {
	if s := in.streams[in.effective]; s != nil {
		if t == mapRequestHeaders {
			s.reqModified = true
		} else {
			s.respModified = true
		}
	}
}

// continueStream is Envoy's Context::continueStream: request and response
// resume after the VM call returns (the paused stream's waiter runs once
// the VM is released); the request headers are no longer available
// afterwards. Downstream is a network-filter type (OK, nothing to do),
// Upstream is unimplemented.
func (in *instance) continueStream(t uint32) Status {
	switch t {
	case streamRequest, streamResponse:
	case streamDownstream:
		return StatusOK
	case streamUpstream:
		return StatusUnimplemented
	default:
		return StatusBadArgument
	}
	s := in.streams[in.effective]
	if s == nil {
		return StatusOK
	}
	if t == streamRequest {
		s.reqOpen = false
	}
	if (t == streamResponse) == s.respPhase {
		s.resumed = true
		s.signal()
	}
	return StatusOK
}

func (h *Host) property(in *instance, path string) ([]byte, bool) {
	switch path {
	case "plugin_name":
		return []byte(h.opts.PluginName), true
	case "plugin_root_id":
		return []byte(h.opts.RootID), true
	case "plugin_vm_id":
		return []byte(h.opts.VMID), true
	}
	if s := in.streams[in.effective]; s != nil {
		return s.property(path)
	}
	return nil, false
}
