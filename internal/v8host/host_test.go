package v8host

// Tests of the behaviours in which the host follows Envoy and its host
// library proxy-wasm-cpp-host, with the project's test guest
// (wasmhost/internal/testguest, whose request header x-mode picks what a
// request does). Each names its source; they are the wazero host's
// (wasmhost/envoy_test.go) on V8.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envoyhosts"
	"github.com/sluicehq/sluice/internal/hosttest"
)

var guestWasm []byte

func TestMain(m *testing.M) {
	var err error
	if guestWasm, err = hosttest.Guest(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func newHost(t testing.TB, opts Options) *Host {
	t.Helper()
	h, err := New(context.Background(), guestWasm, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// run sends one request with headers (name, value, ...).
func run(t testing.TB, h *Host, headers ...string) Response {
	t.Helper()
	var hs [][2]string
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, [2]string{headers[i], headers[i+1]})
	}
	r, err := h.Do(context.Background(), Request{Path: "/api/items?x=1", Authority: "example.com", Headers: hs,
		SourceAddress: "203.0.113.7:4321", RequestID: "req-1"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// upstream returns a header of the request as the upstream got it.
func upstream(t testing.TB, r Response, name string) string {
	t.Helper()
	if r.UpstreamRequest == nil {
		t.Fatalf("the request did not reach the upstream: %+v (%s)", r, r.Body)
	}
	for _, kv := range r.UpstreamRequest {
		if kv[0] == name {
			return kv[1]
		}
	}
	t.Fatalf("header %q missing from %v", name, r.UpstreamRequest)
	return ""
}

func logged(h *Host, level LogLevel, substr string) bool {
	for _, e := range h.Logs() {
		if e.Level == level && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

// TestHost_WASI: the WASI functions answer as cpp-host beb8a4e's
// src/exports.cc.
func TestHost_WASI(t *testing.T) {
	h := newHost(t, Options{Environment: hosttest.WASIEnvironment})
	before := time.Now()
	r := run(t, h, "x-mode", "wasi")
	for k, v := range hosttest.WASIProbe {
		if got := upstream(t, r, k); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
	ns, _ := strconv.ParseInt(upstream(t, r, "x-wasi-realtime"), 10, 64)
	if at := time.Unix(0, ns); at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Errorf("realtime clock %v, want about %v", at, before)
	}
	// stdout is a log entry at info, one per write, its newline dropped.
	if !logged(h, LogInfo, "to stdout") || logged(h, LogInfo, "to stdout\n") {
		t.Errorf("fd_write(1) not logged at info as one line: %v", h.Logs())
	}
}

// TestHost_RefusesImports: a module importing a function the host does not
// provide, or one with another signature, does not load, with Envoy's
// message (cpp-host src/v8/v8.cc, V8::link). path_filestat_get is the
// import that kept the plugin out of Envoy 1.33–1.38.
func TestHost_RefusesImports(t *testing.T) {
	for _, tt := range []struct {
		module, name    string
		params, results []byte
		want            string
	}{
		{"wasi_snapshot_preview1", "path_filestat_get", nil, nil, "Failed to load Wasm module due to a missing import: wasi_snapshot_preview1.path_filestat_get"},
		{"env", "proxy_no_such_call", nil, nil, "Failed to load Wasm module due to a missing import: env.proxy_no_such_call"},
		{"env", "proxy_get_configuration", nil, []byte{hosttest.I32}, "missing import: env.proxy_get_configuration"}, // ABI 0.1.0 only
		{"env", "proxy_log", []byte{hosttest.I32}, []byte{hosttest.I32},
			"Failed to load Wasm module due to an import type mismatch: env.proxy_log, want: i32 -> i32, but host exports: i32 i32 i32 -> i32"},
	} {
		var logs []string
		_, err := New(context.Background(), hosttest.ModuleImporting(tt.module, tt.name, tt.params, tt.results),
			Options{OnLog: func(e LogEntry) { logs = append(logs, e.Message) }})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("import %s.%s: err = %v, want %q", tt.module, tt.name, err, tt.want)
		}
		if !slices.ContainsFunc(logs, func(m string) bool { return strings.Contains(m, tt.want) }) {
			t.Errorf("import %s.%s: not logged: %q", tt.module, tt.name, logs)
		}
	}
}

// TestHost_ProvidesWhatEnvoy133Does: the host offers a module exactly the
// functions the oldest supported Envoy does (internal/envoyhosts).
func TestHost_ProvidesWhatEnvoy133Does(t *testing.T) {
	names, err := Provided(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	oldest := envoyhosts.Hosts()[0]
	var want []string
	for mod, fns := range oldest.Imports {
		for _, n := range fns {
			want = append(want, mod+"."+n)
		}
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the host provides\n%v\n%s provides\n%v", names, oldest.Releases(), want)
	}
}

// TestHost_StartRestrictions: while _initialize runs, only the host calls
// cpp-host's WasmBase::startVm allows work; another traps, and the VM does
// not start.
func TestHost_StartRestrictions(t *testing.T) {
	h := newHost(t, Options{Environment: map[string]string{"TESTGUEST_INIT_LOG": "allowed"}})
	if !logged(h, LogInfo, "init: allowed") {
		t.Errorf("proxy_log during _initialize did not work: %v", h.Logs())
	}
	var logs []string
	_, err := New(context.Background(), guestWasm, Options{Environment: map[string]string{"TESTGUEST_INIT_CALL": "1"},
		OnLog: func(e LogEntry) { logs = append(logs, e.Message) }})
	if err == nil {
		t.Fatal("a restricted call during _initialize was allowed")
	}
	if !slices.Contains(logs, "Function: _initialize failed: Uncaught Error: restricted_callback") {
		t.Errorf("no restricted_callback trap logged: %q", logs)
	}
}

// TestHost_AllocRestrictions: while the guest allocates memory for the host
// (cpp-host WasmBase::allocMemory), only proxy_log, fd_write and
// clock_time_get work; another host call traps, the VM fails, and the
// request gets Envoy's fail-closed answer.
func TestHost_AllocRestrictions(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	r := run(t, h, "x-mode", "alloc-restricted")
	if !r.Local || r.Status != 503 || len(r.Body) != 0 || r.Details != "wasm_fail_stream" {
		t.Fatalf("got %+v, want the failure policy's 503", r)
	}
	if f := h.Failures(); len(f) != 1 || f[0] != "Function: malloc failed: Uncaught Error: restricted_callback" {
		t.Fatalf("failures %q", f)
	}
}

// TestHost_FailedVM: a VM that trapped stays failed: every later request on
// it gets Envoy's failure policy (cpp-host CHECK_FAIL_HTTP; Envoy
// Context::failStream: 503, empty body, details wasm_fail_stream), and
// fail_open lets them pass. proc_exit fails the VM too: the guest cannot
// go on after it.
func TestHost_FailedVM(t *testing.T) {
	for _, mode := range []string{"trap", "trap-response", "exit"} {
		for _, open := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail_open=%v", mode, open), func(t *testing.T) {
				h := newHost(t, Options{Workers: 1, FailOpen: open})
				for i, headers := range [][]string{{"x-mode", mode}, {"x-mode", "echo"}, nil} {
					r := run(t, h, headers...)
					if !r.Failed {
						t.Fatalf("request %d: the VM did not fail: %+v", i+1, r)
					}
					switch {
					case open && (r.Local || r.Status != 200):
						t.Errorf("request %d: %+v, want it passed", i+1, r)
					case !open && (!r.Local || r.Status != 503 || len(r.Body) != 0 || r.Details != "wasm_fail_stream" || len(r.Headers) != 1):
						t.Errorf("request %d: %+v, want 503 with nothing else", i+1, r)
					}
				}
				if f := h.Failures(); len(f) != 1 {
					t.Errorf("failures %q", f)
				}
			})
		}
	}
}

// TestHost_LocalResponseThroughResponseCallback: Envoy sends a local reply
// after the callback returns (Context::sendLocalResponse defers it) through
// the encoder filters, this plugin's proxy_on_response_headers included,
// with content-length and a default content-type
// (source/common/http/utility.cc, sendLocalReply).
func TestHost_LocalResponseThroughResponseCallback(t *testing.T) {
	h := newHost(t, Options{})
	r := run(t, h, "x-mode", "deny")
	if !r.Local || r.Status != 429 || string(r.Body) != "denied" || r.Details != "rate_limited" {
		t.Fatalf("%+v", r)
	}
	for k, v := range map[string]string{"x-saw-local": "429", "content-length": "6", "content-type": "text/plain", "retry-after": "7", "x-reason": "test"} {
		if got, _ := r.Header(k); got != v {
			t.Errorf("%s = %q, want %q (headers %v)", k, got, v, r.Headers)
		}
	}
	// A local reply from the response callback replaces the upstream's.
	r = run(t, h, "x-mode", "respdeny")
	if !r.Local || r.Status != 502 || string(r.Body) != "replaced" {
		t.Errorf("%+v", r)
	}
}

// The plugin reads an upstream's body as Envoy gives it: each part in its
// body callback, the last with the end of the stream, a large part in
// parts of 16 KiB; the client gets it whole. Headers alone end the stream
// at the headers.
func TestHost_ResponseBody(t *testing.T) {
	cases := append(slices.Clone(hosttest.Bodies), hosttest.Body{Parts: nil, Logs: []string{"headers end_of_stream=true"}})
	for _, tc := range cases {
		h := newHost(t, Options{})
		r, err := h.Do(context.Background(), Request{Path: "/", Authority: "example.com", Headers: [][2]string{{"x-mode", "body"}},
			UpstreamBody: tc.Parts})
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Body) != strings.Join(tc.Parts, "") {
			t.Errorf("the client got %d bytes, want %d", len(r.Body), len(strings.Join(tc.Parts, "")))
		}
		var msgs []string
		for _, e := range h.Logs() {
			msgs = append(msgs, e.Message)
		}
		if got := hosttest.BodyLogs(msgs); !slices.Equal(got, tc.Logs) {
			t.Errorf("the guest saw\n%q\nwant\n%q", got, tc.Logs)
		}
	}
}

// TestHost_ABIStatuses: answers in which Envoy differs from a naive host.
func TestHost_ABIStatuses(t *testing.T) {
	h := newHost(t, Options{})
	r := run(t, h, "x-mode", "raw", "X-Mixed-Case", "v")
	// Envoy's HeaderMap::byteSize: names and values, no serialization; the
	// connection manager added x-forwarded-proto.
	bytes := 0
	for _, kv := range [][2]string{{":authority", "example.com"}, {":path", "/api/items?x=1"}, {":method", "GET"},
		{":scheme", "http"}, {"x-mode", "raw"}, {"x-mixed-case", "v"}, {"x-forwarded-proto", "http"}, {"x-request-id", "req-1"}} {
		bytes += len(kv[0]) + len(kv[1])
	}
	want := hosttest.RawProbe(bytes)
	want["x-mixed-case"] = "v" // names reach the plugin lower-cased
	for k, v := range want {
		if got := upstream(t, r, k); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
}

// TestHost_RequestHeadersAndProperties: what a stream reads: its headers,
// properties by NUL-separated path (Envoy's attributes), configurations,
// metrics; and the header changes it makes reach the upstream.
func TestHost_RequestHeadersAndProperties(t *testing.T) {
	h := newHost(t, Options{PluginConfig: []byte("cfg-1"), VMConfig: []byte("vm-cfg"), RootID: "root-x", VMID: "vm-x"})
	r := run(t, h, "x-mode", "echo", "X-Remove-Me", "secret", "x-user", "alice")
	want := map[string]string{
		"x-config": "cfg-1", "x-vm-config": "vm-cfg", "x-eos": "true",
		"x-prop-source.address": "203.0.113.7:4321", "x-prop-source.port": "4321",
		"x-prop-request.path": "/api/items?x=1", "x-prop-request.url_path": "/api/items",
		"x-prop-request.method": "GET", "x-prop-request.host": "example.com",
		"x-prop-request.scheme": "http", "x-prop-request.protocol": "HTTP/1.1", "x-prop-request.id": "req-1",
		"x-prop-plugin_root_id": "root-x", "x-prop-plugin_name": "sluice", "x-prop-plugin_vm_id": "vm-x",
		"x-prop-connection.id": "1", "x-metric-requests": "1", "x-user": "alice",
		// :authority :path :method :scheme x-mode x-remove-me x-user x-forwarded-proto x-request-id
		"x-num-headers": "9", ":path": "/api/items?x=1", "x-request-id": "req-1",
	}
	for k, v := range want {
		if got := upstream(t, r, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	var added []string
	for _, kv := range r.UpstreamRequest {
		switch kv[0] {
		case "x-added":
			added = append(added, kv[1])
		case "x-remove-me", "x-prop-missing", "x-counter-negative":
			t.Errorf("%s present (%q)", kv[0], kv[1])
		}
	}
	if !slices.Equal(added, []string{"a", "b"}) {
		t.Errorf("x-added = %q", added)
	}
	// The response callback saw the upstream's status.
	if got, _ := r.Header("x-guest-saw-status"); got != "200" {
		t.Errorf("x-guest-saw-status = %q (headers %v)", got, r.Headers)
	}
}

// TestHost_SharedDataAcrossVMs: shared data is the proxy's, with CAS
// (cpp-host src/shared_data.cc): every VM sees every write, and a stale
// CAS is refused.
func TestHost_SharedDataAcrossVMs(t *testing.T) {
	h := newHost(t, Options{Workers: 2})
	r1 := run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "one")
	r2 := run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "two")
	if r1.VM == r2.VM {
		t.Fatalf("both requests ran on VM %d", r1.VM)
	}
	if upstream(t, r1, "x-shared-old") != "<none>" || upstream(t, r2, "x-shared-old") != "one" {
		t.Errorf("old values %q, %q", upstream(t, r1, "x-shared-old"), upstream(t, r2, "x-shared-old"))
	}
	stale := upstream(t, r1, "x-shared-cas") // 0: the key was new
	r3 := run(t, h, "x-mode", "shared", "x-key", "k", "x-value", "three", "x-cas", upstream(t, r2, "x-shared-cas"))
	if upstream(t, r3, "x-shared-result") != "proxywasm: CAS mismatch" {
		t.Errorf("a stale CAS (%s, then %s) was accepted: %q", stale, upstream(t, r2, "x-shared-cas"), upstream(t, r3, "x-shared-result"))
	}
}

// TestHost_TickFromStream: any context may set the timer, which is its root
// context's (cpp-host ContextBase::setTimerPeriod).
func TestHost_TickFromStream(t *testing.T) {
	h := newHost(t, Options{Workers: 1})
	r := run(t, h, "x-mode", "tick")
	if r.UpstreamRequest == nil {
		t.Fatalf("%+v", r)
	}
	for _, kv := range r.UpstreamRequest {
		if kv[0] == "x-tick-error" {
			t.Fatalf("SetTickPeriod from a stream: %s", kv[1])
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := h.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if m["test_ticks"] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the root context's timer never ticked")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHost_Callout: call-outs and their failures as Envoy reports them
// (hosttest.Callouts).
func TestHost_Callout(t *testing.T) {
	srv := hosttest.Backend(t)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	h := newHost(t, Options{Workers: 3, Clusters: map[string]string{"backend": srv.URL, "down": closedURL}})
	for _, tt := range hosttest.Callouts {
		t.Run(tt.Name, func(t *testing.T) {
			r := run(t, h, append([]string{"x-mode", "callout"}, tt.Headers...)...)
			if tt.Local == 0 {
				if r.Local {
					t.Fatalf("local = %+v (%s)", r, r.Body)
				}
				if got := upstream(t, r, "x-callout-body"); got != tt.Body {
					t.Errorf("x-callout-body = %q, want %q", got, tt.Body)
				}
				if got := upstream(t, r, "x-callout-status"); got != tt.Status {
					t.Errorf("x-callout-status = %q, want %q", got, tt.Status)
				}
				return
			}
			if !r.Local || r.Status != tt.Local || string(r.Body) != tt.Body {
				t.Fatalf("got %+v (%q), want %d %q", r, r.Body, tt.Local, tt.Body)
			}
			if tt.Status != "" {
				if got, _ := r.Header("x-callout-failure"); got != tt.Status {
					t.Errorf("proxy_get_status = %q, want %q", got, tt.Status)
				}
			}
		})
	}
	r := run(t, h, "x-mode", "callout", "x-callout-path", "/check/2")
	if got := upstream(t, r, "x-callout-upstream"); got != "yes" {
		t.Errorf("call-out response header x-upstream (sent as X-Upstream) = %q", got)
	}
}

// TestHost_LogLevel: entries below the proxy's level are dropped, as
// ENVOY_LOG drops them, and a level past critical is refused.
func TestHost_LogLevel(t *testing.T) {
	h := newHost(t, Options{LogLevel: LogWarn})
	run(t, h, "x-mode", "log", "x-log-level", "2", "x-log", "quiet")
	run(t, h, "x-mode", "log", "x-log-level", "4", "x-log", "loud")
	run(t, h, "x-mode", "log", "x-log-level", "9", "x-log", "nonsense")
	var got []string
	for _, e := range h.Logs() {
		got = append(got, e.Message)
	}
	if !slices.Contains(got, "loud") || slices.Contains(got, "quiet") || slices.Contains(got, "nonsense") {
		t.Errorf("logs %q", got)
	}
}
