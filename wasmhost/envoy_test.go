package wasmhost

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envoyhosts"
	"github.com/sluicehq/sluice/internal/hosttest"
)

// Tests of the behaviours in which the host follows Envoy and its host
// library proxy-wasm-cpp-host rather than a general-purpose WASI runtime.
// Each names its source.

// TestHost_WASI: the WASI functions answer as cpp-host beb8a4e's
// src/exports.cc.
func TestHost_WASI(t *testing.T) {
	at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	h := newHost(t, Options{Now: func() time.Time { return at }, Environment: hosttest.WASIEnvironment})
	r, err := run(t, h, "x-mode", "wasi")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"x-wasi-realtime": strconv.FormatInt(at.UnixNano(), 10)}
	for k, v := range hosttest.WASIProbe {
		want[k] = v
	}
	for k, v := range want {
		if got := mustGet(t, r, k); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
	// stdout is a log entry at info, one per write, its newline dropped.
	var logged bool
	for _, e := range h.Logs() {
		if e.Message == "to stdout" && e.Level == LogLevelInfo {
			logged = true
		}
	}
	if !logged {
		t.Errorf("fd_write(1) not logged at info: %v", h.Logs())
	}
}

// TestHost_RefusesMissingImport: a module importing a function the host
// does not provide does not load, with Envoy's message (cpp-host
// src/v8/v8.cc, V8::link). path_filestat_get is the import that kept the
// plugin out of Envoy 1.33–1.38.
func TestHost_RefusesMissingImport(t *testing.T) {
	for _, imp := range [][2]string{{"wasi_snapshot_preview1", "path_filestat_get"}, {"env", "proxy_no_such_call"}} {
		_, err := New(context.Background(), hosttest.ModuleImporting(imp[0], imp[1], nil, nil), Options{CompilationCache: cache})
		want := "Failed to load Wasm module due to a missing import: " + imp[0] + "." + imp[1]
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("import %s.%s: err = %v, want %q", imp[0], imp[1], err, want)
		}
	}
}

// TestHost_StartRestrictions: while the start function (_initialize) runs,
// only the host calls cpp-host's WasmBase::startVm allows work; another one
// traps, and the VM does not start.
func TestHost_StartRestrictions(t *testing.T) {
	h := newHost(t, Options{Environment: map[string]string{"TESTGUEST_INIT_LOG": "allowed"}})
	var logged bool
	for _, e := range h.Logs() {
		logged = logged || e.Message == "init: allowed"
	}
	if !logged {
		t.Errorf("proxy_log during _initialize did not work: %v", h.Logs())
	}
	_, err := New(context.Background(), guestWasm, Options{CompilationCache: cache, Environment: map[string]string{"TESTGUEST_INIT_CALL": "1"}})
	if err == nil || !strings.Contains(err.Error(), "restricted_callback: env.proxy_get_log_level is not allowed during _initialize") {
		t.Fatalf("err = %v, want a restricted_callback trap", err)
	}
}

// TestHost_AllocRestrictions: while the guest allocates memory for the host
// (cpp-host WasmBase::allocMemory), only proxy_log, fd_write and
// clock_time_get work; another host call traps and the VM fails.
func TestHost_AllocRestrictions(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	r, err := run(t, h, "x-mode", "alloc-restricted")
	if err != nil || r.Local == nil || r.Local.Status != 503 {
		t.Fatalf("got %+v %v, want the failure policy's 503", r, err)
	}
	if h.Failures() != 1 {
		t.Fatalf("Failures = %d, want 1", h.Failures())
	}
	var logged bool
	for _, e := range h.Logs() {
		logged = logged || strings.Contains(e.Message, "env.proxy_get_log_level is not allowed during proxy_on_memory_allocate")
	}
	if !logged {
		t.Errorf("the trap's cause is not logged: %v", h.Logs())
	}
}

// TestHost_ProcExitFailsVM: cpp-host's proc_exit only reports an error, but
// the guest cannot go on after exiting; the VM fails.
func TestHost_ProcExitFailsVM(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	if r, err := run(t, h, "x-mode", "exit"); err != nil || r.Local == nil || r.Local.Status != 503 || h.Failures() != 1 {
		t.Fatalf("got %+v %v, Failures %d", r, err, h.Failures())
	}
}

// TestHost_LocalResponseThroughResponseCallback: Envoy sends a local reply
// after the callback returns (Context::sendLocalResponse defers it) through
// the encoder filters, this plugin's proxy_on_response_headers included,
// with content-length and a default content-type
// (Http::Utility::prepareLocalReply).
func TestHost_LocalResponseThroughResponseCallback(t *testing.T) {
	h := newHost(t, Options{})
	r, err := run(t, h, "x-mode", "deny")
	if err != nil || r.Local == nil {
		t.Fatalf("%+v %v", r, err)
	}
	hd := Result{Headers: r.Local.Headers}
	for k, v := range map[string]string{"x-saw-local": "429", "content-length": "6", "content-type": "text/plain", "retry-after": "7", "x-reason": "test"} {
		if got, _ := hd.Get(k); got != v {
			t.Errorf("%s = %q, want %q (headers %v)", k, got, v, r.Local.Headers)
		}
	}
}

// TestHost_ABIStatuses: answers in which Envoy differs from a naive host.
func TestHost_ABIStatuses(t *testing.T) {
	h := newHost(t, Options{})
	r, err := run(t, h, "x-mode", "raw", "X-Mixed-Case", "v")
	if err != nil {
		t.Fatal(err)
	}
	// Envoy's HeaderMap::byteSize: names and values, no serialization.
	bytes := 0
	for _, kv := range [][2]string{{":authority", "example.com"}, {":path", "/api/items?x=1"}, {":method", "GET"},
		{":scheme", "http"}, {"x-mode", "raw"}, {"x-mixed-case", "v"}, {"x-request-id", "req-1"}} {
		bytes += len(kv[0]) + len(kv[1])
	}
	want := hosttest.RawProbe(bytes)
	for k, v := range want {
		if got := mustGet(t, r, k); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
	if _, ok := r.Get("x-mixed-case"); !ok {
		t.Errorf("header names do not reach the plugin lower-cased: %v", r.Headers)
	}
}

// TestHost_TickFromStream: any context may set the timer, which is its root
// context's (cpp-host ContextBase::setTimerPeriod).
func TestHost_TickFromStream(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	r, err := run(t, h, "x-mode", "tick")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := r.Get("x-tick-error"); ok {
		t.Fatalf("SetTickPeriod from a stream: %s", v)
	}
	v := h.vms[0]
	v.mu.Lock()
	started := v.inst.tickStop != nil
	v.mu.Unlock()
	if !started {
		t.Fatal("the root context's timer did not start")
	}
}

func TestHost_FailurePolicyString(t *testing.T) {
	for p, want := range map[FailurePolicy]string{FailClosed: "fail_closed", FailOpen: "fail_open", FailReload: "fail_reload", 9: "unknown"} {
		if p.String() != want {
			t.Errorf("%d: %s", p, p)
		}
	}
	if !errors.Is(ErrPluginFailed, ErrPluginFailed) {
		t.Fatal("sentinel")
	}
}

// TestHost_ProvidesWhatEnvoy133Does: the host offers a module exactly the
// functions the oldest supported Envoy does (internal/envoyhosts), so a
// module that loads here loads there.
func TestHost_ProvidesWhatEnvoy133Does(t *testing.T) {
	h := newHost(t, Options{})
	oldest := envoyhosts.Hosts()[0]
	want := map[string]bool{}
	for mod, names := range oldest.Imports {
		for _, n := range names {
			want[mod+"."+n] = true
		}
	}
	for name := range h.provided {
		if !want[name] {
			t.Errorf("the host provides %s, which %s does not", name, oldest.Releases())
		}
	}
	for name := range want {
		if !h.provided[name] {
			t.Errorf("the host lacks %s, which %s provides", name, oldest.Releases())
		}
	}
}

// Call-out tokens count up from 1 and skip 0 when they wrap, as Envoy's
// do: a plugin may take 0 for "no call-out".
func TestInstance_NewCallID(t *testing.T) {
	for _, c := range []struct{ last, want uint32 }{{0, 1}, {1, 2}, {math.MaxUint32 - 1, math.MaxUint32}, {math.MaxUint32, 1}} {
		in := &instance{nextCallID: c.last}
		if got := in.newCallID(); got != c.want {
			t.Errorf("after %d: %d, want %d", c.last, got, c.want)
		}
	}
}

// Stream context ids count up, wrap to 0 and skip those in use, as
// cpp-host's do: after the largest id come 0, then the first id neither
// the root (1) nor a live stream holds.
func TestInstance_NewContextID(t *testing.T) {
	in := &instance{rootID: 1, nextID: math.MaxUint32, streams: map[uint32]*Stream{2: nil, math.MaxUint32 - 1: nil}}
	var got []uint32
	for range 3 {
		id := in.newContextID()
		got = append(got, id)
		in.streams[id] = nil
	}
	if want := []uint32{math.MaxUint32, 0, 3}; !slices.Equal(got, want) {
		t.Errorf("ids %v, want %v", got, want)
	}
}
