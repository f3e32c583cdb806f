package wasmhost

import (
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

	bufferCallRespBody = 4
	bufferVMConfig     = 6
	bufferPluginConfig = 7

	streamRequest  = 0
	streamResponse = 1
)

type hostFunc struct {
	name   string
	params int             // i32 parameters, or
	types  []api.ValueType // explicit types when not all i32
	fn     func(in *instance, m api.Memory, p []uint64) Status
}

// exportHostFunctions defines module "env" with every host function of ABI
// v0.2.1. Functions the host does not model answer UNIMPLEMENTED.
func (h *Host) exportHostFunctions(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	i32 := api.ValueTypeI32
	for _, f := range h.hostFuncs() {
		types := f.types
		if types == nil {
			types = make([]api.ValueType, f.params)
			for i := range types {
				types[i] = i32
			}
		}
		fn := f.fn
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, st []uint64) {
			in, ok := ctx.Value(instanceKey{}).(*instance)
			if !ok || in.dead {
				st[0] = uint64(StatusInternalFailure)
				return
			}
			if in.vm.h.opts.MeasureGuest && in.depth == 1 {
				start := time.Now()
				st[0] = uint64(fn(in, m.Memory(), st))
				in.hostNanos += time.Since(start).Nanoseconds()
				return
			}
			st[0] = uint64(fn(in, m.Memory(), st))
		}), types, []api.ValueType{i32}).Export(f.name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

func unimplemented(in *instance, m api.Memory, p []uint64) Status { return StatusUnimplemented }

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
		{"proxy_set_tick_period_milliseconds", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			if in.effective != in.rootID {
				return StatusBadArgument
			}
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
		{"proxy_get_header_map_size", 2, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			if st != StatusOK {
				return st
			}
			if !m.WriteUint32Le(u32(p, 1), uint32(len(hm.Append(in.buf[:0])))) {
				return StatusInvalidMemoryAccess
			}
			return StatusOK
		}},
		{"proxy_get_header_map_pairs", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			hm, st := in.headerMap(u32(p, 0))
			if st != StatusOK {
				return st
			}
			in.buf = hm.Append(in.buf[:0])
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
		{"proxy_close_stream", 1, nil, func(in *instance, m api.Memory, p []uint64) Status {
			t := u32(p, 0)
			if t > streamResponse {
				return StatusBadArgument
			}
			s := in.streams[in.effective]
			if s == nil {
				return StatusNotFound
			}
			s.fail(ErrStreamReset)
			return StatusOK
		}},
		{"proxy_send_local_response", 8, nil, func(in *instance, m api.Memory, p []uint64) Status {
			s := in.streams[in.effective]
			if s == nil {
				return StatusBadArgument
			}
			details, ok1 := readString(m, u32(p, 1), u32(p, 2))
			body, ok2 := read(m, u32(p, 3), u32(p, 4))
			hb, ok3 := read(m, u32(p, 5), u32(p, 6))
			if !ok1 || !ok2 || !ok3 {
				return StatusInvalidMemoryAccess
			}
			hm, err := fields.Parse(hb)
			if err != nil {
				return StatusBadArgument
			}
			s.local = &LocalResponse{Status: int(u32(p, 0)), Details: details, Headers: hm, Body: append([]byte{}, body...)}
			s.signal()
			return StatusOK
		}},
		{"proxy_get_status", 3, nil, func(in *instance, m api.Memory, p []uint64) Status {
			if in.callResp == nil {
				return StatusNotFound
			}
			if !m.WriteUint32Le(u32(p, 0), in.callResp.status) {
				return StatusInvalidMemoryAccess
			}
			return in.give(nil, u32(p, 1), u32(p, 2))
		}},
		{"proxy_http_call", 10, nil, func(in *instance, m api.Memory, p []uint64) Status {
			return h.httpCall(in, m, p)
		}},
		{"proxy_get_property", 4, nil, func(in *instance, m api.Memory, p []uint64) Status {
			raw, ok := read(m, u32(p, 0), u32(p, 1))
			if !ok {
				return StatusInvalidMemoryAccess
			}
			// Envoy takes the path as NUL-separated segments; dots are accepted too.
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
	case 0, 1, 2, 3, 5, 8: // bodies, TCP data, gRPC, FFI: not modeled
	default:
		return nil, StatusBadArgument
	}
	return nil, StatusNotFound
}

var emptyMap fields.Map

// headerMap returns the map t of the effective context.
func (in *instance) headerMap(t uint32) (*fields.Map, Status) {
	s := in.streams[in.effective]
	switch t {
	case mapRequestHeaders:
		if s != nil {
			return &s.req, StatusOK
		}
	case mapResponseHeaders:
		if s != nil && s.respPhase {
			return &s.resp, StatusOK
		}
	case mapRequestTrailers, mapResponseTrailers, mapCallRespTrailers:
		emptyMap = emptyMap[:0]
		return &emptyMap, StatusOK
	case mapCallRespHeaders:
		if in.callResp != nil {
			return &in.callResp.headers, StatusOK
		}
	case 4, 5: // gRPC metadata
	default:
		return nil, StatusBadArgument
	}
	return nil, StatusNotFound
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
	k, ok1 := readString(m, u32(p, 1), u32(p, 2))
	v, ok2 := readString(m, u32(p, 3), u32(p, 4))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	f(hm, k, v)
	return StatusOK
}

func (in *instance) continueStream(t uint32) Status {
	if t > 3 {
		return StatusBadArgument
	}
	if t > streamResponse {
		return StatusUnimplemented
	}
	s := in.streams[in.effective]
	if s == nil {
		return StatusNotFound
	}
	if (t == streamResponse) != s.respPhase {
		return StatusBadArgument
	}
	s.resumed = true
	s.signal()
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
