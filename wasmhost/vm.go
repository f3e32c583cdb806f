package wasmhost

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// vm is one worker slot. Its instance is replaced when it traps; mu
// serializes every call into the instance, as a VM is single-threaded.
type vm struct {
	h    *Host
	idx  int
	mu   sync.Mutex
	inst *instance // nil after a failed restart; recreated on next use
}

type instanceKey struct{}

// instance is one instantiated module and its proxy-wasm state. Every field
// is guarded by vm.mu.
type instance struct {
	vm  *vm
	mod api.Module
	ctx context.Context // carries the instance to host functions

	malloc, onContextCreate, onVMStart, onConfigure, onTick, onHTTPCallResponse,
	onRequestHeaders, onResponseHeaders, onLog, onDone, onDelete api.Function

	// depth counts guest calls in progress (host functions may call back
	// into the guest); hostNanos is host-function time within the current
	// outermost call, for Options.MeasureGuest.
	depth     int
	hostNanos int64

	stack  [8]uint64
	mstack [1]uint64
	buf    []byte // serialization scratch

	rootID    uint32
	nextID    uint32
	effective uint32
	streams   map[uint32]*Stream

	// Buffers readable during the current callback.
	vmConfig     []byte
	pluginConfig []byte
	inConfigure  bool
	inVMStart    bool
	callResp     *calloutResponse

	nextCallID uint32
	tickStop   chan struct{}
	dead       bool
	trapped    bool // a nested call (malloc) trapped; the outer call counts as a crash
}

type calloutResponse struct {
	headers fields.Map
	body    []byte
	status  uint32
}

// newInstance instantiates the module for v and runs _initialize, the root
// context, proxy_on_vm_start and proxy_on_configure with the current config.
func (h *Host) newInstance(v *vm) (*instance, error) {
	in := &instance{vm: v, rootID: 1, nextID: 2, streams: map[uint32]*Stream{}}
	in.ctx = context.WithValue(context.Background(), instanceKey{}, in)
	stderr := &lineWriter{h: h, vm: v.idx}
	cfg := wazero.NewModuleConfig().WithName("").WithStartFunctions().
		WithSysWalltime().WithSysNanotime().WithSysNanosleep().WithRandSource(rand.Reader).
		WithStdout(stderr).WithStderr(stderr)
	for _, k := range sortedKeys(h.opts.Environment) {
		cfg = cfg.WithEnv(k, h.opts.Environment[k])
	}
	mod, err := h.rt.InstantiateModule(in.ctx, h.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	in.mod = mod
	fn := func(name string) api.Function { return mod.ExportedFunction(name) }
	in.malloc = fn("proxy_on_memory_allocate")
	if in.malloc == nil {
		in.malloc = fn("malloc")
	}
	in.onContextCreate, in.onVMStart, in.onConfigure = fn("proxy_on_context_create"), fn("proxy_on_vm_start"), fn("proxy_on_configure")
	in.onTick, in.onHTTPCallResponse = fn("proxy_on_tick"), fn("proxy_on_http_call_response")
	in.onRequestHeaders, in.onResponseHeaders = fn("proxy_on_request_headers"), fn("proxy_on_response_headers")
	in.onLog, in.onDone, in.onDelete = fn("proxy_on_log"), fn("proxy_on_done"), fn("proxy_on_delete")
	fail := func(err error) (*instance, error) {
		in.dead = true
		in.stopTick()
		_ = mod.Close(context.Background())
		return nil, err
	}
	if in.malloc == nil {
		return fail(errors.New("module exports neither proxy_on_memory_allocate nor malloc"))
	}
	if init := fn("_initialize"); init != nil {
		if _, err := in.call(init); err != nil {
			return fail(fmt.Errorf("_initialize: %w", err))
		}
	} else if start := fn("_start"); start != nil {
		if _, err := in.call(start); err != nil {
			return fail(fmt.Errorf("_start: %w", err))
		}
	}
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
// module does not export) returns 0.
func (in *instance) call(fn api.Function, args ...uint64) (uint64, error) {
	if fn == nil {
		return 0, nil
	}
	st := in.stack[:]
	copy(st, args)
	in.trapped = false
	measure := in.vm.h.opts.MeasureGuest && in.depth == 0
	var start time.Time
	if measure {
		start, in.hostNanos = time.Now(), 0
	}
	in.depth++
	err := fn.CallWithStack(in.ctx, st)
	in.depth--
	if measure {
		in.vm.h.guestNanos.Add(time.Since(start).Nanoseconds() - in.hostNanos)
	}
	if err == nil && in.trapped {
		err = errors.New("a nested guest call trapped")
	}
	return st[0], err
}

func (in *instance) configure(cfg []byte) error {
	in.pluginConfig, in.inConfigure = cfg, true
	in.effective = in.rootID
	ok, err := in.call(in.onConfigure, uint64(in.rootID), uint64(len(cfg)))
	in.pluginConfig, in.inConfigure = nil, false
	if err != nil {
		return fmt.Errorf("proxy_on_configure: %w: %w", ErrPluginCrashed, err)
	}
	if in.onConfigure != nil && uint32(ok) == 0 {
		return ErrConfigRefused
	}
	return nil
}

// instance returns the live instance, restarting the VM if an earlier
// restart failed. Called with v.mu held.
func (v *vm) instance() (*instance, error) {
	if v.h.closed.Load() {
		return nil, ErrClosed
	}
	if v.inst != nil {
		return v.inst, nil
	}
	in, err := v.h.newInstance(v)
	if err != nil {
		v.h.log(v.idx, LogLevelCritical, "host: restarting vm: "+err.Error())
		return nil, fmt.Errorf("%w: restart: %w", ErrPluginCrashed, err)
	}
	v.inst = in
	return in, nil
}

// crash replaces a trapped instance: its streams fail, and a new instance
// starts with the current configuration. Called with v.mu held.
func (v *vm) crash(in *instance, cause error) error {
	if in.dead {
		return ErrPluginCrashed
	}
	v.h.crashes.Add(1)
	v.h.log(v.idx, LogLevelCritical, "host: vm trapped, replacing it: "+cause.Error())
	in.dead = true
	in.stopTick()
	in.failStreams(ErrPluginCrashed)
	_ = in.mod.Close(context.Background())
	v.inst = nil
	if _, err := v.instance(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %w", ErrPluginCrashed, cause)
}

func (v *vm) configure(cfg []byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	in, err := v.instance()
	if err != nil {
		return err
	}
	err = in.configure(cfg)
	if errors.Is(err, ErrPluginCrashed) {
		return v.crash(in, err)
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
					_ = v.crash(in, err)
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
	if err := in.malloc.CallWithStack(in.ctx, in.mstack[:]); err != nil {
		in.trapped = true
		return StatusInternalFailure
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

// lineWriter turns the guest's stdout and stderr (panic messages, stack
// traces) into log entries at error level.
type lineWriter struct {
	h   *Host
	vm  int
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.h.log(w.vm, LogLevelError, "guest: "+string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
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
