// Command plugin is Sluice's proxy-wasm HTTP filter. Build it with `make
// wasm`:
//
//	go run ./internal/tools/buildwasm -o build/plugin.wasm ./plugin
//
// which is GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared, then its
// data segments merged (internal/wasmbuild).
//
// It only connects the ABI binding (plugin/proxywasm) to the filter logic
// (plugin/filter), which is plain Go and tested natively.
package main

import (
	"io"
	"syscall"
	"unsafe"

	"github.com/sluicehq/sluice/plugin/filter"
	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

func init() { proxywasm.SetVMContext(vm{}) }

// main never runs in a c-shared (reactor) module; init registers the plugin.
func main() {}

type vm struct{ proxywasm.DefaultVMContext }

func (vm) NewPluginContext(contextID uint32) proxywasm.PluginContext {
	return filter.NewPlugin(&abiHost{}, contextID)
}

// abiHost implements filter.Host with the proxy-wasm host calls. Its
// methods take a pointer: called through the interface, value methods
// would each go through a generated wrapper, a call that costs in
// WebAssembly on every host call.
type abiHost struct{}

// requestHeaders gives the filter the request headers of the current
// callback, fetched and indexed with one host call the first time it asks
// for one: a request looks up half a dozen headers, and a host call costs
// more than scanning the map.
type requestHeaders struct {
	view proxywasm.HeaderMapView
	seq  uint64 // the callback view belongs to; 0: none
}

var reqHeaders requestHeaders

// fresh tells whether r.view is the current callback's headers.
func (r *requestHeaders) fresh() bool { return proxywasm.CallbackSeq() == r.seq }

// current makes r.view the current callback's headers unless it is, and
// tells whether it is (a host that cannot give the map is asked for each
// header on its own).
func (r *requestHeaders) current() bool { return r.fresh() || r.fetch() }

// fetch is not inlined, so that current is: it runs once a callback.
//
//go:noinline
func (r *requestHeaders) fetch() bool {
	if err := proxywasm.GetRequestHeaderMapView(&r.view); err != nil {
		return false
	}
	r.seq = proxywasm.CallbackSeq()
	return true
}

// Header implements rules.HeaderSource.
func (r *requestHeaders) Header(name string) string {
	if !r.current() {
		return view(proxywasm.GetRequestHeaderBytes(name))
	}
	v, _ := r.view.Get(name)
	return v
}

// view turns a host view into a string without copying; valid only during
// the current callback, which is all the filter asks of it.
func view(b []byte, err error) string {
	if err != nil || len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func (*abiHost) PluginConfig() ([]byte, error) { return proxywasm.GetPluginConfiguration() }

func (*abiHost) RequestHeaders() rules.HeaderSource { return &reqHeaders }

func (*abiHost) RequestPseudoHeaders() (method, path, authority string) {
	if !reqHeaders.current() {
		return view(proxywasm.GetRequestHeaderBytes(":method")), view(proxywasm.GetRequestHeaderBytes(":path")),
			view(proxywasm.GetRequestHeaderBytes(":authority"))
	}
	return reqHeaders.view.Pseudo()
}

func (*abiHost) RequestPath() string {
	if reqHeaders.fresh() { // read already: no host call
		v, _ := reqHeaders.view.Get(":path")
		return v
	}
	return view(proxywasm.GetRequestHeaderBytes(":path"))
}

func (*abiHost) RemoveRequestHeader(name string) { _ = proxywasm.RemoveRequestHeader(name) }

func (*abiHost) ResponseHeader(name string) string {
	return view(proxywasm.GetResponseHeaderBytes(name))
}

func (*abiHost) ReadResponseBody(size int, w io.Writer) {
	_ = proxywasm.VisitHTTPResponseBody(size, w)
}

func (*abiHost) Property(path string) string {
	switch path {
	case "source.address":
		return view(proxywasm.GetProperty("source", "address"))
	case "request.id":
		return view(proxywasm.GetProperty("request", "id"))
	case "connection.uri_san_peer_certificate":
		return view(proxywasm.GetProperty("connection", "uri_san_peer_certificate"))
	case "connection.dns_san_peer_certificate":
		return view(proxywasm.GetProperty("connection", "dns_san_peer_certificate"))
	}
	return ""
}

func (*abiHost) AddResponseHeader(name string, value []byte) {
	_ = proxywasm.AddResponseHeaderBytes(name, value)
}

// SendLocalResponse skips the response headers first: a host may run
// them before proxy_send_local_response returns.
func (*abiHost) SendLocalResponse(contextID, status uint32, headers []byte, body []byte) {
	proxywasm.SkipResponseHeaders(contextID)
	_ = proxywasm.SendLocalResponse(status, "sluice", body, headers)
}

func (*abiHost) SkipResponseHeaders(contextID uint32) { proxywasm.SkipResponseHeaders(contextID) }

func (*abiHost) ResumeRequest() { _ = proxywasm.ResumeHTTPRequest() }

func (*abiHost) Dispatch(cluster string, headers [][2]string, body []byte, timeoutMS uint32) (uint32, error) {
	return proxywasm.DispatchHTTPCall(cluster, headers, body, nil, timeoutMS)
}

func (*abiHost) CallResponse(bodySize int) (string, []byte) {
	status := view(proxywasm.GetHTTPCallResponseHeaderBytes(":status"))
	body, _ := proxywasm.GetHTTPCallResponseBody(bodySize)
	return status, body
}

func (*abiHost) SetEffectiveContext(id uint32) { _ = proxywasm.SetEffectiveContext(id) }

func (*abiHost) SharedGetCAS(key string) ([]byte, uint32) {
	v, cas, err := proxywasm.GetSharedData(key)
	if err != nil {
		return nil, 0
	}
	return v, cas
}

func (*abiHost) SharedSetCAS(key string, value []byte, cas uint32) bool {
	return proxywasm.SetSharedData(key, value, cas) == nil
}

func (*abiHost) NowNanos() int64 {
	n, err := proxywasm.GetCurrentTimeNanos()
	if err != nil {
		return 0
	}
	return n
}

func (*abiHost) Log(level proxywasm.LogLevel, msg []byte) {
	if len(msg) > 0 {
		_ = proxywasm.Log(level, unsafe.String(&msg[0], len(msg)))
	}
}

func (*abiHost) DefineCounter(name string) uint32 {
	id, _ := proxywasm.DefineMetric(proxywasm.MetricCounter, name)
	return id
}

func (*abiHost) IncCounter(id uint32) { _ = proxywasm.IncrementMetric(id, 1) }

func (*abiHost) AddCounter(id uint32, n int64) {
	if n > 0 {
		_ = proxywasm.IncrementMetric(id, n)
	}
}

func (*abiHost) DefineGauge(name string) uint32 {
	id, _ := proxywasm.DefineMetric(proxywasm.MetricGauge, name)
	return id
}

// AddGauge adds n, which may be negative: Envoy adds to or takes from a
// gauge by the increment's sign.
func (*abiHost) AddGauge(id uint32, n int64) { _ = proxywasm.IncrementMetric(id, n) }

func (*abiHost) DefineHistogram(name string) uint32 {
	id, _ := proxywasm.DefineMetric(proxywasm.MetricHistogram, name)
	return id
}

func (*abiHost) Record(id uint32, v int64) { _ = proxywasm.RecordMetric(id, uint64(max(v, 0))) }

func (*abiHost) LogLevel() proxywasm.LogLevel {
	l, err := proxywasm.GetLogLevel()
	if err != nil {
		return proxywasm.LogLevelInfo
	}
	return l
}

func (*abiHost) SetTickPeriod(ms uint32) { _ = proxywasm.SetTickPeriod(ms) }

// Env reads the environment the runtime copied from WASI environ_get when
// the module started: what the proxy gives the VM (Envoy:
// vm_config.environment_variables), not the proxy's own environment.
func (*abiHost) Env(name string) (string, bool) { return syscall.Getenv(name) }
