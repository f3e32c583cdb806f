package proxywasm

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"unsafe"
)

func TestStatus_Err(t *testing.T) {
	tests := []struct {
		s    Status
		want error
	}{
		{StatusOK, nil}, {StatusNotFound, ErrNotFound}, {StatusBadArgument, ErrBadArgument},
		{StatusCASMismatch, ErrCASMismatch}, {StatusUnimplemented, ErrUnimplemented},
		{StatusInvalidMemoryAccess, ErrInvalidMemoryAccess}, {99, ErrUnknownStatus},
	}
	for _, tt := range tests {
		if got := tt.s.Err(); !errors.Is(got, tt.want) || (tt.want == nil && got != nil) {
			t.Errorf("Status(%d).Err() = %v, want %v", tt.s, got, tt.want)
		}
	}
}

func TestArena_Allocate(t *testing.T) {
	enter()
	a := allocate(0)
	b := allocate(3)
	if a == nil || b == nil || a == b {
		t.Fatalf("allocate returned %p %p", a, b)
	}
	if uintptr(b)%8 != 0 {
		t.Errorf("block not 8-byte aligned: %p", b)
	}
	big := allocate(arenaSize + 1) // falls back to the heap
	if len(arena.overflow) != 1 || unsafe.Pointer(&arena.overflow[0][0]) != big {
		t.Fatalf("oversized block not kept alive: %d", len(arena.overflow))
	}
	enter() // a nested callback (the host calling back during a host call)
	leave()
	if arena.off == 0 {
		t.Fatal("nested leave reset the arena")
	}
	leave()
	if arena.off != 0 || len(arena.overflow) != 0 {
		t.Fatalf("outermost leave did not reset: off=%d overflow=%d", arena.off, len(arena.overflow))
	}
	enter()
	if c := allocate(3); c != a {
		t.Errorf("arena not reused after reset")
	}
	leave()
}

func TestArena_AllocateDoesNotAllocateInSteadyState(t *testing.T) {
	enter()
	leave()
	n := testing.AllocsPerRun(100, func() {
		enter()
		for i := 0; i < 10; i++ {
			allocate(100)
		}
		leave()
	})
	if n != 0 {
		t.Fatalf("allocs per callback = %v", n)
	}
}

func TestAppendHeaderMap(t *testing.T) {
	got := AppendHeaderMap(nil, [][2]string{{"a", "1"}, {"b", "22"}})
	want := []byte{2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 0, '1', 0, 'b', 0, '2', '2', 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if got := AppendHeaderMap([]byte("x"), nil); string(got) != "x" {
		t.Fatalf("empty map appended %q", got)
	}
}

func TestParseHeaderMap(t *testing.T) {
	in := [][2]string{{":path", "/a"}, {"x", ""}, {"", "v"}}
	got, err := ParseHeaderMap(AppendHeaderMap(nil, in))
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("round trip = %v, %v", got, err)
	}
	for name, b := range map[string][]byte{
		"short":       {1, 0, 0},
		"count":       {200, 0, 0, 0, 0},
		"no nul":      {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 1, 'b', 0},
		"extra bytes": {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 'b', 0, 0},
		"overflow":    {1, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255, 0, 0},
	} {
		if _, err := ParseHeaderMap(b); !errors.Is(err, ErrMalformedMap) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	for _, empty := range [][]byte{nil, {0}} {
		if m, err := ParseHeaderMap(empty); err != nil || len(m) != 0 {
			t.Errorf("empty %v: %v %v", empty, m, err)
		}
	}
}

func TestHeaderMapView(t *testing.T) {
	var v HeaderMapView
	if err := v.Reset(AppendHeaderMap(nil, [][2]string{{":path", "/a"}, {"x-a", "1"}, {"x-a", "2"}, {"x-b", ""}})); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		ok         bool
	}{{":path", "/a", true}, {"x-a", "1", true}, {"x-b", "", true}, {"x-c", "", false}, {"X-A", "", false}} {
		if got, ok := v.Get(c.name); got != c.want || ok != c.ok {
			t.Errorf("Get(%q) = %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	// The first of each pseudo-header, compared exactly; names of the
	// same length and last byte are others.
	if err := v.Reset(AppendHeaderMap(nil, [][2]string{{":pbth", "no"}, {":Path", "no"}, {":path", "/p"}, {":path", "/q"},
		{":mexhod", "no"}, {":authority", "h"}, {":method", "PUT"}, {":authorizy", "no"}})); err != nil {
		t.Fatal(err)
	}
	if method, path, authority := v.Pseudo(); method != "PUT" || path != "/p" || authority != "h" {
		t.Errorf("Pseudo() = %q, %q, %q", method, path, authority)
	}
	if err := v.Reset([]byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 1, 'b', 0}); !errors.Is(err, ErrMalformedMap) || v.Len() != 0 {
		t.Errorf("malformed map: %v, %d pairs", err, v.Len())
	}
	if method, path, authority := v.Pseudo(); method+path+authority != "" {
		t.Errorf("Pseudo() of a malformed map = %q, %q, %q", method, path, authority)
	}
	b := AppendHeaderMap(nil, [][2]string{{"a", "1"}, {"b", "2"}})
	if n := testing.AllocsPerRun(100, func() { _ = v.Reset(b); v.Get("b") }); n != 0 {
		t.Errorf("allocs = %v", n)
	}
}

func TestVisitHeaderMap_NoAllocs(t *testing.T) {
	b := AppendHeaderMap(nil, [][2]string{{"a", "1"}, {"b", "2"}})
	count := 0
	n := testing.AllocsPerRun(100, func() {
		_ = VisitHeaderMap(b, func(k, v []byte) { count += len(k) + len(v) })
	})
	if n != 0 || count == 0 {
		t.Fatalf("allocs = %v, count = %d", n, count)
	}
}

func FuzzParseHeaderMap(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add(AppendHeaderMap(nil, [][2]string{{"a", "1"}, {"b", "22"}}))
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 1, 0, 0, 0, 'a', 0})
	f.Add(AppendHeaderMap(nil, [][2]string{{":path", "/a"}, {":method", "GET"}, {":mexhod", "x"}, {":authority", "h"}, {":path", "/b"}}))
	f.Add(AppendHeaderMap(nil, [][2]string{{":scheme", "http"}, {":pbth", "x"}, {":authorizy", "y"}, {":", ""}, {"", "z"}}))
	var v HeaderMapView
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseHeaderMap(b)
		// The view accepts exactly what the parser does, and finds each
		// name's first value.
		if verr := v.Reset(b); (verr != nil) != (err != nil) || v.Len() != len(m) {
			t.Fatalf("view of %v: %v, %d pairs; parser: %v, %d pairs", b, verr, v.Len(), err, len(m))
		}
		for i, kv := range m {
			got, ok := v.Get(kv[0])
			first := slices.IndexFunc(m, func(p [2]string) bool { return p[0] == kv[0] })
			if !ok || (first == i && got != kv[1]) {
				t.Fatalf("view of %v: Get(%q) = %q, %v; want %q", m, kv[0], got, ok, m[first][1])
			}
		}
		// Pseudo has the first value of each of its three names.
		var want [3]string
		for i, name := range [3]string{":method", ":path", ":authority"} {
			if j := slices.IndexFunc(m, func(p [2]string) bool { return p[0] == name }); j >= 0 {
				want[i] = m[j][1]
			}
		}
		if method, path, authority := v.Pseudo(); [3]string{method, path, authority} != want {
			t.Fatalf("view of %v: Pseudo() = %q, %q, %q; want %q", m, method, path, authority, want)
		}
		if err != nil {
			return
		}
		back, err := ParseHeaderMap(AppendHeaderMap(nil, m))
		if err != nil || len(back) != len(m) || (len(m) > 0 && !reflect.DeepEqual(back, m)) {
			t.Fatalf("round trip of %v: %v %v", m, back, err)
		}
	})
}

// Dispatch: contexts are created, routed and deleted by id.

type recVM struct {
	DefaultVMContext
	log *[]string
}

func (v recVM) NewPluginContext(id uint32) PluginContext { return &recRoot{log: v.log} }

type recRoot struct {
	DefaultPluginContext
	log *[]string
}

func (r *recRoot) OnPluginStart(n int) bool { *r.log = append(*r.log, "configure"); return n > 0 }
func (r *recRoot) NewHTTPContext(id uint32) HTTPContext {
	return &recStream{log: r.log}
}
func (r *recRoot) OnHTTPCallResponse(id uint32, h, b, tr int) {
	*r.log = append(*r.log, "callout")
}

type recStream struct {
	DefaultHTTPContext
	log *[]string
}

func (s *recStream) OnRequestHeaders(int, bool) Action { *s.log = append(*s.log, "req"); return Pause }
func (s *recStream) OnRequestBody(int, bool) Action    { *s.log = append(*s.log, "body"); return Pause }
func (s *recStream) OnLog()                            { *s.log = append(*s.log, "log") }
func (s *recStream) OnDone()                           { *s.log = append(*s.log, "done") }

func TestDispatch_Lifecycle(t *testing.T) {
	var log []string
	SetVMContext(recVM{log: &log})
	t.Cleanup(func() { SetVMContext(nil); roots.Clear(); streams.Clear() })
	if !onVMStart(0) {
		t.Fatal("vm start refused")
	}
	onContextCreate(1, 0)
	if onConfigure(1, 0) || !onConfigure(1, 5) {
		t.Fatal("configure did not pass the size through")
	}
	onContextCreate(2, 1)
	onContextCreate(3, 99) // unknown parent: ignored
	if a := onRequestHeaders(2, 3, true); a != Pause {
		t.Fatalf("action = %d", a)
	}
	if a := onRequestBody(2, 10, true); a != Pause {
		t.Fatalf("body action = %d", a)
	}
	if a := onResponseBody(2, 10, true); a != Continue {
		t.Fatalf("unhandled response body = %d, want Continue", a)
	}
	if a := onRequestHeaders(3, 3, true); a != Continue {
		t.Fatalf("unknown stream action = %d", a)
	}
	if responseStream(2) == nil {
		t.Fatal("stream 2 not called on its response headers")
	}
	SkipResponseHeaders(2)
	SkipResponseHeaders(3) // no such context: nothing happens
	if responseStream(2) != nil {
		t.Fatal("stream 2 called on its response headers after it skipped them")
	}
	if responseStream(3) != nil {
		t.Fatal("unknown stream called on its response headers")
	}
	onHTTPCallResponse(1, 7, 0, 0, 0)
	if !onDone(2) {
		t.Fatal("stream done refused")
	}
	onLog(2)
	onDelete(2)
	onDelete(2) // twice is harmless
	want := []string{"configure", "configure", "req", "body", "callout", "log", "done"}
	if !reflect.DeepEqual(log, want) {
		t.Fatalf("calls = %v, want %v", log, want)
	}
	if streams.Len() != 0 {
		t.Fatalf("stream context not deleted: %v", streams)
	}
}

// Context ids wrap past the largest to 0 in Envoy (cpp-host skips only
// ids in use): a stream of id 0 is served as any other.
func TestDispatch_StreamIDZero(t *testing.T) {
	var log []string
	SetVMContext(recVM{log: &log})
	t.Cleanup(func() { SetVMContext(nil); roots.Clear(); streams.Clear() })
	onContextCreate(1, 0)
	onContextCreate(0, 1)
	if a := onRequestHeaders(0, 3, true); a != Pause {
		t.Fatalf("stream 0: action %d, want Pause", a)
	}
	onDelete(0)
	if want := []string{"req", "done"}; !reflect.DeepEqual(log, want) || streams.Len() != 0 {
		t.Fatalf("calls %v, want %v; %d streams left", log, want, streams.Len())
	}
}

func TestAPI_NativeReturnsUnimplemented(t *testing.T) {
	if _, err := GetRequestHeaderBytes("x"); !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("err = %v", err)
	}
	if _, err := DispatchHTTPCall("c", [][2]string{{":path", "/"}}, nil, nil, 10); !errors.Is(err, ErrUnimplemented) {
		t.Fatalf("err = %v", err)
	}
}

func TestPropertyInt64(t *testing.T) {
	if v, ok := PropertyInt64([]byte{0x39, 0x30, 0, 0, 0, 0, 0, 0}); !ok || v != 12345 {
		t.Fatalf("got %d %v", v, ok)
	}
	if _, ok := PropertyInt64([]byte{1}); ok {
		t.Fatal("short value accepted")
	}
}

type panicRoot struct {
	recRoot
	got []string // "context/stream/value" of each OnPanic
}

func (r *panicRoot) OnPanic(id uint32, s HTTPContext, v any) Action {
	r.got = append(r.got, fmt.Sprintf("%d/%v/%s", id, s != nil, panicText(v)))
	if s != nil {
		return Pause
	}
	panic("OnPanic itself panics") // recovered and logged, never escapes
}

type panicVM struct {
	DefaultVMContext
	root *panicRoot
}

func (v panicVM) NewPluginContext(uint32) PluginContext { return v.root }

func TestDispatch_Recovered(t *testing.T) {
	var log []string
	root := &panicRoot{recRoot: recRoot{log: &log}}
	SetVMContext(panicVM{root: root})
	t.Cleanup(func() { SetVMContext(nil); roots.Clear(); streams.Clear() })
	onContextCreate(1, 0)
	onContextCreate(2, 1)
	if a := recovered("proxy_on_request_headers", 2, errors.New("boom")); a != Pause {
		t.Errorf("stream panic: action %d, want the root's Pause", a)
	}
	if a := recovered("proxy_on_tick", 1, "tock"); a != Continue {
		t.Errorf("root panic: action %d, want Continue", a)
	}
	if a := recovered("proxy_on_request_headers", 9, 42); a != Continue {
		t.Errorf("unknown context: action %d", a)
	}
	want := []string{"2/true/boom", "1/false/tock"}
	if !reflect.DeepEqual(root.got, want) {
		t.Errorf("OnPanic calls = %v, want %v", root.got, want)
	}
}
