// Package hosttest holds what the tests of the project's proxy-wasm hosts
// (wasmhost on wazero, internal/v8host on V8) share: the test guest, an
// upstream for its call-outs, and what Envoy answers it, so that both
// hosts are held to one table.
package hosttest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/wasmbuild"
)

// Guest builds the test guest (wasmhost/internal/testguest), a plugin
// whose request header x-mode picks what a request does.
func Guest() ([]byte, error) {
	dir, err := os.MkdirTemp("", "hosttest-guest")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "testguest.wasm")
	if err := wasmbuild.Build("github.com/sluicehq/sluice/wasmhost/internal/testguest", out); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

// Backend is an upstream for the guest's call-outs. /slow waits; /deny
// answers "deny"; /reset drops the connection mid-body, /close before
// answering; /seen describes
// the request it got; every other path is echoed, with status 202.
func Backend(t testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Upstream", "yes")
		switch r.URL.Path {
		case "/slow":
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		case "/deny":
			io.WriteString(w, "deny")
			return
		case "/redirect":
			w.Header().Set("Location", "/check/9")
			w.WriteHeader(http.StatusFound)
			return
		case "/reset":
			// Headers, then the connection drops mid-body.
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		case "/close":
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		case "/seen":
			fmt.Fprintf(w, "%s %s host=%s from=%s body=%s", r.Method, r.URL.Path, r.Host, r.Header.Get("X-From"), b)
			return
		}
		w.WriteHeader(202)
		io.WriteString(w, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Callout is one call-out of the guest (x-mode: callout) and what Envoy
// makes of it (Context::httpCall, onHttpCallSuccess and onHttpCallFailure;
// what fails before a response starts is a local reply of Envoy's router).
// The host runs it with the clusters "backend" (Backend) and "down" (a
// closed port).
type Callout struct {
	Name    string
	Headers []string // request headers, name and value, after x-mode
	// Local is the status of the guest's local reply, 0 when the request
	// continued upstream.
	Local int
	// Body is the local reply's body, or when continued the call-out
	// response body the guest put in x-callout-body.
	Body string
	// Status is x-callout-status (the call-out's :status) when continued,
	// x-callout-failure (proxy_get_status) on a local reply; "" is unchecked.
	Status string
}

// RefusedBody is what Envoy's router answers when it cannot connect.
const RefusedBody = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: 111"

// TerminatedBody is what Envoy's router answers when the upstream closes
// the connection before its answer.
const TerminatedBody = "upstream connect error or disconnect/reset before headers. reset reason: connection termination"

// Callouts are the call-out cases every host must answer as Envoy does.
var Callouts = []Callout{
	{"continue", []string{"x-callout-path", "/check/1"}, 0, "/check/1", "202"},
	{"what the upstream got", []string{"x-callout-path", "/seen"}, 0, "POST /seen host=backend.local from=guest body=payload", "200"},
	{"deny body", []string{"x-callout-path", "/deny"}, 403, "deny", ""},
	{"timeout", []string{"x-callout-path", "/slow", "x-timeout", "50"}, 0, "upstream request timeout", "504"},
	{"connection refused", []string{"x-cluster", "down"}, 0, RefusedBody, "503"},
	{"closed before headers", []string{"x-callout-path", "/close"}, 0, TerminatedBody, "503"},
	{"reset after headers", []string{"x-callout-path", "/reset"}, 503, "call-out failed", "11 reset"},
	// Envoy's async client hands a redirect to the plugin; it follows none.
	{"redirect", []string{"x-callout-path", "/redirect"}, 0, "", "302"},
	{"unknown cluster", []string{"x-cluster", "nope"}, 502, "proxywasm: bad argument", ""},
}

// WASIEnvironment is the VM environment WASIProbe expects.
var WASIEnvironment = map[string]string{"A": "1", "BB": "22"}

// WASIProbe is what the guest (x-mode: wasi) puts in its request headers:
// each WASI call's errno and results as cpp-host beb8a4e's src/exports.cc
// answers them. (x-wasi-realtime, the clock, is the host's to check.)
var WASIProbe = map[string]string{
	"x-wasi-fd_read": "52", "x-wasi-poll_oneoff": "52", "x-wasi-path_open": "44",
	"x-wasi-fd_prestat_get": "8", "x-wasi-fd_prestat_dir_name": "52", "x-wasi-fd_fdstat_set_flags": "52",
	"x-wasi-fd_fdstat_get_1": "0", "x-wasi-fdstat-rights": "64", "x-wasi-fd_fdstat_get_3": "8",
	"x-wasi-clock_realtime": "0", "x-wasi-clock_monotonic": "0", "x-wasi-clock_cputime": "58",
	"x-wasi-random_get_max": "0", "x-wasi-random_get_over": "28", "x-wasi-sched_yield": "0",
	"x-wasi-args_sizes_get": "0", "x-wasi-argc": "0",
	"x-wasi-environ_sizes_get": "0", "x-wasi-environ": "2/10", // "A=1\0" "BB=22\0"
	"x-wasi-fd_write_1": "0", "x-wasi-written": "10", "x-wasi-fd_write_3": "8",
}

// RawProbe is what the guest (x-mode: raw) puts in its request headers:
// proxy-wasm statuses in which Envoy differs from a naive host. mapBytes
// is the request headers' size as Envoy's HeaderMap::byteSize counts it
// (names and values).
func RawProbe(mapBytes int) map[string]string {
	return map[string]string{
		"x-raw-map_size": "0", "x-raw-map-bytes": fmt.Sprint(mapBytes),
		"x-raw-resp_map_size":       "2",  // no response headers yet: BadArgument (Context::getMap)
		"x-raw-continue_downstream": "0",  // Context::continueStream
		"x-raw-continue_upstream":   "12", // Unimplemented
		"x-raw-continue_bad":        "2",  // BadArgument (exports.cc continue_stream)
		"x-raw-status":              "0", "x-raw-status-code": "0",
		"x-raw-property_dotted": "1", // NotFound: paths are NUL-separated (Context::getProperty)
	}
}

// Value types of the binary format.
const (
	I32 byte = 0x7f
	I64 byte = 0x7e
)

// ModuleImporting is a minimal proxy-wasm module: it imports module.name
// as a function params -> results, exports proxy_abi_version_0_2_1 and a
// memory, and does nothing else.
func ModuleImporting(module, name string, params, results []byte) []byte {
	str := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	vec := func(b []byte) []byte { return append([]byte{byte(len(b))}, b...) }
	section := func(id byte, body ...byte) []byte { return append([]byte{id, byte(len(body))}, body...) }
	b := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	// Types: 0 is the import's, 1 is () -> ().
	types := []byte{2, 0x60}
	types = append(types, vec(params)...)
	types = append(types, vec(results)...)
	types = append(types, 0x60, 0, 0)
	b = append(b, section(1, types...)...)
	imp := append([]byte{1}, str(module)...)
	imp = append(imp, str(name)...)
	imp = append(imp, 0, 0) // a function of type 0
	b = append(b, section(2, imp...)...)
	b = append(b, section(3, 1, 1)...)    // one function of type 1
	b = append(b, section(5, 1, 0, 1)...) // one memory, min 1 page
	exp := []byte{2}
	exp = append(exp, str("proxy_abi_version_0_2_1")...)
	exp = append(exp, 0, 1) // function 1 (0 is the import)
	exp = append(exp, str("memory")...)
	exp = append(exp, 2, 0)
	b = append(b, section(7, exp...)...)
	b = append(b, section(10, 1, 2, 0, 0x0b)...) // its body: no locals, end
	return b
}

// Body is an upstream's response body in parts, and what the guest
// (x-mode: body) logs of it (BodyLogs) when a host passes it as Envoy
// does: the headers with a body to follow, each part in a body callback,
// the last with the end of the stream, a part larger than 16 KiB read in
// parts of 16 KiB.
type Body struct {
	Parts []string
	Logs  []string
}

// Bodies are the response bodies every host must pass as Envoy does.
var Bodies = func() []Body {
	big := strings.Repeat("a", 40_000) + "z"
	const bigLog = "body 40001 end_of_stream=false parts=16384,16384,7233 aaaaaaaaaaaaaaaa...aaaaaaaaaaaaaaaz"
	return []Body{
		{[]string{`{"usage":`, big, "}"}, []string{"headers end_of_stream=false", `body 9 end_of_stream=false parts=9 {"usage":`,
			bigLog, "body 1 end_of_stream=true parts=1 }"}},
		{[]string{`{"usage":`, big, ""}, []string{"headers end_of_stream=false", `body 9 end_of_stream=false parts=9 {"usage":`,
			bigLog, "body 0 end_of_stream=true parts= "}},
	}
}()

// BodyLogs picks, from a host's log messages, those of the guest's body
// mode, in order.
func BodyLogs(messages []string) []string {
	var out []string
	for _, m := range messages {
		if strings.HasPrefix(m, "headers ") || strings.HasPrefix(m, "body ") {
			out = append(out, m)
		}
	}
	return out
}
