package wasmhost

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// The WASI a plugin gets is Envoy's, not a general-purpose one: the
// functions proxy-wasm-cpp-host registers and nothing more, each answering
// as cpp-host does. A module importing any other WASI function is refused
// at load, as Envoy refuses it. Sources: cpp-host beb8a4e (the host library
// of Envoy 1.33–1.38, whose WASI set equals c4d7bb0's),
// include/proxy-wasm/exports.h (FOR_ALL_WASI_FUNCTIONS) and
// src/exports.cc (the wasi_unstable_* functions); src/wasm.cc
// (WasmBase::registerCallbacks) registers each under both module names.

// WASI errno values cpp-host returns.
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoFault   = 21
	errnoInval   = 28
	errnoNoent   = 44
	errnoNosys   = 52
	errnoNotsup  = 58
)

// randomGetMax is cpp-host's PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES
// (include/proxy-wasm/limits.h).
const randomGetMax = 64 << 10

var wasiModules = [...]string{"wasi_snapshot_preview1", "wasi_unstable"}

type wasiFunc struct {
	name    string
	params  []api.ValueType
	results []api.ValueType
	// fn returns the errno; proc_exit, which has no result, never returns.
	fn func(in *instance, m api.Memory, p []uint64) uint32
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func wasiFuncs() []wasiFunc {
	errno := []api.ValueType{i32}
	return []wasiFunc{
		// stdout and stderr become log entries at info and error, one per
		// call with one trailing newline removed (writevImpl).
		{"fd_write", []api.ValueType{i32, i32, i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			var level LogLevel
			switch u32(p, 0) {
			case 1:
				level = LogLevelInfo
			case 2:
				level = LogLevelError
			default:
				return errnoBadf
			}
			iovs, n := u32(p, 1), u32(p, 2)
			var msg []byte
			for i := uint32(0); i < n; i++ {
				ptr, ok1 := m.ReadUint32Le(iovs + 8*i)
				size, ok2 := m.ReadUint32Le(iovs + 8*i + 4)
				if !ok1 || !ok2 {
					return errnoFault
				}
				if size == 0 {
					continue
				}
				b, ok := m.Read(ptr, size)
				if !ok {
					return errnoFault
				}
				msg = append(msg, b...)
			}
			written := uint32(len(msg))
			if written > 0 {
				if msg[len(msg)-1] == '\n' {
					msg = msg[:len(msg)-1]
				}
				in.vm.h.log(in.vm.idx, level, string(msg))
			}
			if !m.WriteUint32Le(u32(p, 3), written) {
				return errnoFault
			}
			return errnoSuccess
		}},
		// "Don't support reading of any files."
		{"fd_read", []api.ValueType{i32, i32, i32, i32}, errno, errnoFunc(errnoNosys)},
		// fd_seek and fd_close report an error (Envoy's Context::error logs
		// it at trace) and answer success.
		{"fd_seek", []api.ValueType{i32, i64, i32, i32}, errno, traceFunc("wasi_unstable fd_seek")},
		{"fd_close", []api.ValueType{i32}, errno, traceFunc("wasi_unstable fd_close")},
		// Only stdout and stderr exist: filetype 0, rights FD_WRITE (64).
		{"fd_fdstat_get", []api.ValueType{i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			if fd := u32(p, 0); fd != 1 && fd != 2 {
				return errnoBadf
			}
			var st [24]byte
			binary.LittleEndian.PutUint64(st[8:], 64)
			if !m.Write(u32(p, 1), st[:]) {
				return errnoFault
			}
			return errnoSuccess
		}},
		{"fd_fdstat_set_flags", []api.ValueType{i32, i32}, errno, errnoFunc(errnoNosys)},
		{"environ_get", []api.ValueType{i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			arr, buf := u32(p, 0), u32(p, 1)
			for _, kv := range in.vm.h.environ {
				if !m.WriteUint32Le(arr, buf) || !m.Write(buf, kv) {
					return errnoFault
				}
				arr += 4
				buf += uint32(len(kv))
			}
			return errnoSuccess
		}},
		{"environ_sizes_get", []api.ValueType{i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			size := 0
			for _, kv := range in.vm.h.environ {
				size += len(kv)
			}
			if !m.WriteUint32Le(u32(p, 0), uint32(len(in.vm.h.environ))) || !m.WriteUint32Le(u32(p, 1), uint32(size)) {
				return errnoFault
			}
			return errnoSuccess
		}},
		// No arguments.
		{"args_get", []api.ValueType{i32, i32}, errno, errnoFunc(errnoSuccess)},
		{"args_sizes_get", []api.ValueType{i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			if !m.WriteUint32Le(u32(p, 0), 0) || !m.WriteUint32Le(u32(p, 1), 0) {
				return errnoFault
			}
			return errnoSuccess
		}},
		// Realtime is the proxy's clock (the one proxy_get_current_time_
		// nanoseconds reads), monotonic its monotonic clock; CPU-time
		// clocks are not supported.
		{"clock_time_get", []api.ValueType{i32, i64, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			h := in.vm.h
			var t uint64
			switch u32(p, 0) {
			case 0:
				t = uint64(h.opts.Now().UnixNano())
			case 1:
				t = uint64(time.Since(h.started).Nanoseconds()) + 1
			default:
				return errnoNotsup
			}
			if !m.WriteUint64Le(u32(p, 2), t) {
				return errnoFault
			}
			return errnoSuccess
		}},
		{"random_get", []api.ValueType{i32, i32}, errno, func(in *instance, m api.Memory, p []uint64) uint32 {
			n := u32(p, 1)
			if n > randomGetMax {
				return errnoInval
			}
			if n == 0 {
				return errnoSuccess
			}
			b := make([]byte, n)
			_, _ = rand.Read(b)
			if !m.Write(u32(p, 0), b) {
				return errnoFault
			}
			return errnoSuccess
		}},
		{"sched_yield", nil, errno, errnoFunc(errnoSuccess)},
		// No sleeping: a guest that would block gets ENOSYS.
		{"poll_oneoff", []api.ValueType{i32, i32, i32, i32}, errno, errnoFunc(errnoNosys)},
		// cpp-host only reports an error (a trace log in Envoy) and returns
		// to the guest, which cannot go on after exiting: the Go runtime
		// then runs code that is never meant to run. The VM is as good as
		// failed, so it fails here, where the cause is known.
		{"proc_exit", []api.ValueType{i32}, nil, func(in *instance, m api.Memory, p []uint64) uint32 {
			panic(fmt.Errorf("wasi_unstable proc_exit(%d)", u32(p, 0)))
		}},
		{"path_open", []api.ValueType{i32, i32, i32, i32, i32, i64, i64, i32, i32}, errno, errnoFunc(errnoNoent)},
		{"fd_prestat_get", []api.ValueType{i32, i32}, errno, errnoFunc(errnoBadf)},
		{"fd_prestat_dir_name", []api.ValueType{i32, i32, i32}, errno, errnoFunc(errnoNosys)},
	}
}

func errnoFunc(e uint32) func(*instance, api.Memory, []uint64) uint32 {
	return func(*instance, api.Memory, []uint64) uint32 { return e }
}

func traceFunc(msg string) func(*instance, api.Memory, []uint64) uint32 {
	return func(in *instance, _ api.Memory, _ []uint64) uint32 {
		in.vm.h.log(in.vm.idx, LogLevelTrace, msg)
		return errnoSuccess
	}
}

// instantiateWASI defines both WASI module names with wasiFuncs.
func (h *Host) instantiateWASI(ctx context.Context) error {
	funcs := wasiFuncs()
	for _, mod := range wasiModules {
		b := h.rt.NewHostModuleBuilder(mod)
		for _, f := range funcs {
			name, fn, hasResult := mod+"."+f.name, f.fn, len(f.results) > 0
			h.provided[name] = true
			b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, st []uint64) {
				in, ok := instanceOf(ctx)
				if !ok || in.dead {
					panic(errVMFailed)
				}
				in.checkAllowed(name)
				e := fn(in, m.Memory(), st)
				if hasResult {
					st[0] = uint64(e)
				}
			}), f.params, f.results).Export(f.name)
		}
		if _, err := b.Instantiate(ctx); err != nil {
			return err
		}
	}
	return nil
}

// checkImports refuses a module that imports a function the host does not
// provide, with Envoy's message (cpp-host src/v8/v8.cc, V8::link).
func (h *Host) checkImports(compiled wazero.CompiledModule) error {
	for _, f := range compiled.ImportedFunctions() {
		mod, name, _ := f.Import()
		if !h.provided[mod+"."+name] {
			return fmt.Errorf("Failed to load Wasm module due to a missing import: %s.%s", mod, name)
		}
	}
	return nil
}

// Host calls allowed while the host runs the guest's start function and
// while it asks the guest for memory (cpp-host src/wasm.cc
// WasmBase::startVm, include/proxy-wasm/wasm.h WasmBase::allocMemory). Any
// other host call there traps, which fails the VM.
var (
	allowedAtStart = allowSet("env.emscripten_notify_memory_growth", "env.proxy_log",
		"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
		"fd_fdstat_get", "fd_fdstat_set_flags")
	allowedInAlloc = allowSet("env.proxy_log", "fd_write", "clock_time_get")
)

// allowSet builds an allow-list; a bare name is a WASI function under both
// module names.
func allowSet(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		if strings.Contains(n, ".") {
			m[n] = true
			continue
		}
		for _, mod := range wasiModules {
			m[mod+"."+n] = true
		}
	}
	return m
}

// checkAllowed traps (as V8::trap("restricted_callback") does in cpp-host)
// when the host is in a restricted phase and name is not allowed in it.
func (in *instance) checkAllowed(name string) {
	if in.allowed != nil && !in.allowed[name] {
		panic(fmt.Errorf("restricted_callback: %s is not allowed during %s", name, in.phase))
	}
}
