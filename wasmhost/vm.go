package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// errVMFailed is the cause of a call into a VM that has already failed.
var errVMFailed = errors.New("wasmhost: the VM has failed")

// vm is one worker slot; mu serializes every call into its instance, as a
// VM is single-threaded. When the instance fails (a trap), the slot follows
// Options.FailurePolicy: it stays failed, or with FailReload a new
// instance starts for a later request.
type vm struct {
	h        *Host
	idx      int
	mu       sync.Mutex
	inst     *instance // nil while failed
	lastLoad time.Time // when the current or last instance started
}

type instanceKey struct{}

// instanceCtx is the context every call into an instance runs with. Host
// functions find their instance in it with one type assertion
// (instanceOf), where context.WithValue's Value walked the chain through
// an interface call on every host call of the guest.
type instanceCtx struct {
	context.Context
	in *instance
}

func (c *instanceCtx) Value(key any) any {
	if key == (instanceKey{}) {
		return c.in
	}
	return c.Context.Value(key)
}

// instanceOf returns the instance a host function was called for.
func instanceOf(ctx context.Context) (*instance, bool) {
	if c, ok := ctx.(*instanceCtx); ok {
		return c.in, true
	}
	in, ok := ctx.Value(instanceKey{}).(*instance)
	return in, ok
}

// instance is one instantiated module and its proxy-wasm state. Every field
// is guarded by vm.mu.
type instance struct {
	vm  *vm
	mod api.Module
	ctx context.Context // carries the instance to host functions

	malloc, onContextCreate, onVMStart, onConfigure, onTick, onHTTPCallResponse,
	onRequestHeaders, onResponseHeaders, onResponseBody, onLog, onDone, onDelete api.Function

	// respBody is the response body part of the body callback in
	// progress (inRespBody), the buffer HttpResponseBody.
	respBody   []byte
	inRespBody bool

	// depth counts guest calls in progress (host functions may call back
	// into the guest); hostNanos is host-function time within the current
	// outermost call, for Options.MeasureGuest.
	depth     int
	hostNanos int64

	stack  [8]uint64
	mstack [1]uint64
	buf    []byte // serialization scratch
	// The serialized headers of the last local response and their parse
	// (localHeaders).
	localRaw []byte
	localMap fields.Map

	rootID    uint32
	nextID    uint32
	effective uint32
	streams   map[uint32]*Stream

	// allowed, during a restricted phase (the start function, a memory
	// allocation), is the set of host calls the guest may make; phase
	// names it for the trap message. nil outside those phases.
	allowed map[string]bool
	phase   string
	// after holds work deferred until the outermost guest call returns,
	// as cpp-host's DeferAfterCallActions and Envoy's
	// addAfterVmCallAction defer local replies.
	after []func()

	// Buffers readable during the current callback.
	vmConfig     []byte
	pluginConfig []byte
	inConfigure  bool
	configErrLog string // the last warning or error the plugin logged while configuring
	inVMStart    bool
	callResp     *calloutResponse

	nextCallID uint32
	// inlineOK: the guest call in progress is a stream's header callback,
	// whose goroutine waits for the stream if the plugin pauses it; inline
	// is the first call-out dispatched during it (c nil: none), which that
	// goroutine sends itself while it waits (Stream.await).
	inlineOK bool
	inline   calloutJob
	tickStop chan struct{}
	dead     bool
	trapped  error // a nested call (malloc) trapped: the outer call fails the VM with this cause
}

type calloutResponse struct {
	headers fields.Map
	body    []byte
	failed  bool // no response: the plugin gets no headers and status "reset"
}

// newInstance instantiates the module for v and runs _initialize, the root
// context, proxy_on_vm_start and proxy_on_configure with the current config.
func (h *Host) newInstance(v *vm) (*instance, error) {
	v.lastLoad = time.Now()
	in := &instance{vm: v, rootID: 1, nextID: 2, streams: map[uint32]*Stream{}}
	in.ctx = &instanceCtx{context.Background(), in}
	// The guest's WASI is the host's own (wasi.go): no wazero system
	// interfaces, no start functions run by wazero.
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions()
	mod, err := h.rt.InstantiateModule(in.ctx, h.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	in.mod = mod
	fn := func(name string) api.Function { return mod.ExportedFunction(name) }
	// cpp-host looks for malloc first (WasmBase::getFunctions).
	in.malloc = fn("malloc")
	if in.malloc == nil {
		in.malloc = fn("proxy_on_memory_allocate")
	}
	in.onContextCreate, in.onVMStart, in.onConfigure = fn("proxy_on_context_create"), fn("proxy_on_vm_start"), fn("proxy_on_configure")
	in.onTick, in.onHTTPCallResponse = fn("proxy_on_tick"), fn("proxy_on_http_call_response")
	in.onRequestHeaders, in.onResponseHeaders = fn("proxy_on_request_headers"), fn("proxy_on_response_headers")
	in.onResponseBody = fn("proxy_on_response_body")
	in.onLog, in.onDone, in.onDelete = fn("proxy_on_log"), fn("proxy_on_done"), fn("proxy_on_delete")
	fail := func(err error) (*instance, error) {
		in.dead = true
		in.stopTick()
		_ = mod.Close(context.Background())
		return nil, err
	}
	if in.malloc == nil {
		return fail(errors.New("Wasm module is missing malloc function."))
	}
	// A reactor's _initialize (and main, when it exports one) runs with
	// only the host calls cpp-host's WasmBase::startVm allows.
	in.allowed, in.phase = allowedAtStart, "_initialize"
	if init := fn("_initialize"); init != nil {
		if _, err := in.call(init); err != nil {
			return fail(fmt.Errorf("_initialize: %w", err))
		}
		if main := fn("main"); main != nil {
			if _, err := in.call(main, 0, 0); err != nil {
				return fail(fmt.Errorf("main: %w", err))
			}
		}
	} else if start := fn("_start"); start != nil {
		if _, err := in.call(start); err != nil {
			return fail(fmt.Errorf("_start: %w", err))
		}
	}
	in.allowed, in.phase = nil, ""
	in.effective = in.rootID
	if _, err := in.call(in.onContextCreate, uint64(in.rootID), 0); err != nil {
		return fail(fmt.Errorf("proxy_on_context_create(root): %w", err))
	}
	in.vmConfig, in.inVMStart = h.opts.VMConfig, true
	ok, err := in.call(in.onVMStart, uint64(in.rootID), uint64(len(h.opts.VMConfig)))
	in.inVMStart = false
	if err != nil {
		return fail(fmt.Errorf("proxy_on_vm_start: %w", err))
	}
	if in.onVMStart != nil && uint32(ok) == 0 {
		return fail(errors.New("proxy_on_vm_start returned false"))
	}
	if err := in.configure(h.currentConfig()); err != nil {
		return fail(err)
	}
	return in, nil
}

// call runs an exported function; a nil function (an optional callback the
// module does not export) returns 0. When the outermost call returns, the
// work it deferred runs (local replies through the response callback); an
// error from that work is the call's error.
func (in *instance) call(fn api.Function, args ...uint64) (uint64, error) {
	if fn == nil {
		return 0, nil
	}
	if in.dead {
		return 0, errVMFailed
	}
	st := in.stack[:]
	copy(st, args)
	in.trapped = nil
	measure := in.vm.h.opts.MeasureGuest && in.depth == 0
	var start time.Time
	if measure {
		start, in.hostNanos = time.Now(), 0
	}
	in.depth++
	err := fn.CallWithStack(in.ctx, st)
	in.depth--
	if measure {
		in.vm.h.guestNanos.Add(max(0, time.Since(start).Nanoseconds()-in.vm.h.clockCost-in.hostNanos))
	}
	if in.trapped != nil {
		err = in.trapped // the cause; what the outer call did afterwards ran on a broken VM
	}
	if err != nil {
		in.after = in.after[:0]
		return 0, err
	}
	result := st[0]
	for in.depth == 0 && len(in.after) > 0 {
		a := in.after[0]
		in.after = in.after[1:]
		a()
		if in.dead {
			in.after = in.after[:0]
			return 0, errVMFailed
		}
	}
	return result, nil
}

// defer_ queues f to run when the outermost guest call returns.
func (in *instance) defer_(f func()) { in.after = append(in.after, f) }

// configure gives the VM cfg. A refusal's error carries the last warning
// or error the plugin logged meanwhile, which is where a plugin says why
// (Envoy shows it only in its log).
func (in *instance) configure(cfg []byte) error {
	in.pluginConfig, in.inConfigure, in.configErrLog = cfg, true, ""
	in.effective = in.rootID
	ok, err := in.call(in.onConfigure, uint64(in.rootID), uint64(len(cfg)))
	in.pluginConfig, in.inConfigure = nil, false
	if err != nil {
		return fmt.Errorf("proxy_on_configure: %w: %w", ErrPluginFailed, err)
	}
	if in.onConfigure != nil && uint32(ok) == 0 {
		if in.configErrLog != "" {
			return fmt.Errorf("%w (it logged: %s)", ErrConfigRefused, in.configErrLog)
		}
		return ErrConfigRefused
	}
	return nil
}

// live returns the VM's instance, or nil when the VM has failed and is not
// to be reloaded yet. Called with v.mu held.
func (v *vm) live() (*instance, error) {
	if v.h.closed.Load() {
		return nil, ErrClosed
	}
	if v.inst != nil {
		return v.inst, nil
	}
	if v.h.opts.FailurePolicy != FailReload || time.Since(v.lastLoad) < v.h.opts.ReloadBackoff {
		return nil, nil
	}
	in, err := v.h.newInstance(v)
	if err != nil {
		v.h.log(v.idx, LogLevelCritical, "host: reloading the VM: "+err.Error())
		return nil, nil
	}
	v.h.log(v.idx, LogLevelInfo, "host: VM reloaded")
	v.inst = in
	return in, nil
}

// fail marks a VM failed after cause (a trap): its timer stops, its paused
// streams are answered by the failure policy, and until a reload every
// request on it is. Called with v.mu held; failing twice is harmless.
func (v *vm) fail(in *instance, cause error) {
	if in.dead {
		return
	}
	v.h.failures.Add(1)
	v.h.log(v.idx, LogLevelCritical, "host: VM failed: "+cause.Error())
	in.dead = true
	in.stopTick()
	in.failStreams(errVMFailed)
	_ = in.mod.Close(context.Background())
	if v.inst == in {
		v.inst = nil
	}
}

func (v *vm) configure(cfg []byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	in, err := v.live()
	if err != nil || in == nil {
		return err // a failed VM takes its configuration when it reloads
	}
	err = in.configure(cfg)
	if errors.Is(err, ErrPluginFailed) {
		v.fail(in, err)
	}
	return err
}

func (in *instance) failStreams(err error) {
	for _, s := range in.streams {
		s.fail(err)
	}
}

func (in *instance) stopTick() {
	if in.tickStop != nil {
		close(in.tickStop)
		in.tickStop = nil
	}
}

// setTick (re)starts the timer of the root context.
func (in *instance) setTick(period time.Duration) {
	in.stopTick()
	if period <= 0 {
		return
	}
	stop := make(chan struct{})
	in.tickStop = stop
	v, h := in.vm, in.vm.h
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-h.ctx.Done():
				return
			case <-t.C:
			}
			v.mu.Lock()
			select {
			case <-stop:
				v.mu.Unlock()
				return
			default:
			}
			if v.inst == in && !in.dead {
				in.effective = in.rootID
				if _, err := in.call(in.onTick, uint64(in.rootID)); err != nil {
					v.fail(in, err)
				}
			}
			v.mu.Unlock()
		}
	}()
}

// give copies b into guest memory allocated by the guest and stores its
// address and size at retPtr and retSize.
func (in *instance) give(b []byte, retPtr, retSize uint32) Status {
	mem := in.mod.Memory()
	if len(b) == 0 {
		if !mem.WriteUint32Le(retPtr, 0) || !mem.WriteUint32Le(retSize, 0) {
			return StatusInvalidMemoryAccess
		}
		return StatusOK
	}
	in.mstack[0] = uint64(len(b))
	allowed, phase := in.allowed, in.phase
	in.allowed, in.phase = allowedInAlloc, "proxy_on_memory_allocate"
	err := in.malloc.CallWithStack(in.ctx, in.mstack[:])
	in.allowed, in.phase = allowed, phase
	if err != nil {
		in.trapped = fmt.Errorf("proxy_on_memory_allocate: %w", err)
		return StatusInvalidMemoryAccess // cpp-host: allocMemory returned nothing
	}
	p := uint32(in.mstack[0])
	if p == 0 {
		return StatusInternalFailure
	}
	// Memory may have grown during the allocation; Write re-reads it.
	if !mem.Write(p, b) || !mem.WriteUint32Le(retPtr, p) || !mem.WriteUint32Le(retSize, uint32(len(b))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (h *Host) log(vmIdx int, level LogLevel, msg string) {
	if level < h.opts.LogLevel {
		return
	}
	e := LogEntry{Time: time.Now(), VM: vmIdx, Level: level, Message: msg}
	h.logs.add(e)
	if h.opts.OnLog != nil {
		h.opts.OnLog(e)
	}
	if l := h.opts.Logger; l != nil {
		l.Log(context.Background(), slogLevel(level), msg, "plugin", h.opts.PluginName, "vm", vmIdx)
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
