//go:build wasip1

// Command testguest is a proxy-wasm plugin that exercises every host
// function the host implements. The host tests build it with
// GOOS=wasip1 GOARCH=wasm -buildmode=c-shared. The request header "x-mode"
// selects what a request does; without it the request passes untouched
// (the benchmark's trivial guest).
package main

import (
	"errors"
	"runtime"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/plugin/proxywasm"
)

func main() {}

// The binding leaves these two out (a plugin rarely needs them); the host's
// tests do.

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) { proxywasm.ProxyOnLog(contextID) }

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) uint32 { return proxywasm.ProxyOnDone(contextID) }

func init() {
	initHostCall()
	proxywasm.SetVMContext(&vm{})
}

var (
	vmConfig   string
	config     string
	requests   uint32 // counter test_requests
	gauge      uint32 // gauge test_gauge
	hist       uint32 // histogram test_hist
	ticks      uint32 // counter test_ticks
	logs       uint32 // counter test_logs
	deletes    uint32 // counter test_deletes
	hotCounter uint32 // counter test_hot
)

type vm struct{ proxywasm.DefaultVMContext }

func (*vm) OnVMStart(size int) bool {
	b, err := proxywasm.GetVMConfiguration()
	if err != nil && size > 0 {
		return false
	}
	vmConfig = string(b)
	return vmConfig != "refuse-vm"
}

func (*vm) NewPluginContext(id uint32) proxywasm.PluginContext {
	return &root{id: id, pending: map[uint32]*stream{}}
}

type root struct {
	proxywasm.DefaultPluginContext
	id      uint32
	pending map[uint32]*stream // call-out id → waiting stream
}

func (r *root) OnPluginStart(size int) bool {
	b, err := proxywasm.GetPluginConfiguration()
	if err != nil && size > 0 {
		proxywasm.LogError("config: " + err.Error())
		return false
	}
	if string(b) == "refuse" {
		proxywasm.LogWarn("refusing configuration")
		return false
	}
	config = string(b)
	for _, m := range []struct {
		id   *uint32
		t    proxywasm.MetricType
		name string
	}{
		{&requests, proxywasm.MetricCounter, "test_requests"},
		{&gauge, proxywasm.MetricGauge, "test_gauge"},
		{&hist, proxywasm.MetricHistogram, "test_hist"},
		{&ticks, proxywasm.MetricCounter, "test_ticks"},
		{&logs, proxywasm.MetricCounter, "test_logs"},
		{&deletes, proxywasm.MetricCounter, "test_deletes"},
		{&hotCounter, proxywasm.MetricCounter, "test_hot"},
	} {
		id, err := proxywasm.DefineMetric(m.t, m.name)
		if err != nil {
			proxywasm.LogError("define " + m.name + ": " + err.Error())
			return false
		}
		*m.id = id
	}
	if len(config) > 5 && config[:5] == "tick=" {
		ms, _ := strconv.Atoi(config[5:])
		if err := proxywasm.SetTickPeriod(uint32(ms)); err != nil {
			return false
		}
	} else {
		_ = proxywasm.SetTickPeriod(0)
	}
	proxywasm.LogInfo("configured: " + config)
	return true
}

func (r *root) OnTick() { _ = proxywasm.IncrementMetric(ticks, 1) }

func (r *root) OnHTTPCallResponse(id uint32, numHeaders, bodySize, _ int) {
	s, ok := r.pending[id]
	if !ok {
		proxywasm.LogError("unknown call-out " + strconv.Itoa(int(id)))
		return
	}
	delete(r.pending, id)
	if err := proxywasm.SetEffectiveContext(s.id); err != nil {
		proxywasm.LogError("set effective context: " + err.Error())
		return
	}
	if numHeaders == 0 {
		_ = proxywasm.SendLocalResponse(503, "callout_failed", []byte("call-out failed"), proxywasm.AppendHeaderMap(nil, [][2]string{{"x-callout-failure", calloutStatus()}}))
		return
	}
	status, _ := proxywasm.GetHTTPCallResponseHeaderBytes(":status")
	body, err := proxywasm.GetHTTPCallResponseBody(bodySize)
	if size, ok := callResponseBodySize(); err != nil || len(body) != bodySize || !ok || size != bodySize {
		_ = proxywasm.SendLocalResponse(500, "callout_body", []byte("body size mismatch"), nil)
		return
	}
	if string(body) == "deny" {
		_ = proxywasm.SendLocalResponse(403, "callout_denied", body, proxywasm.AppendHeaderMap(nil, [][2]string{{"x-callout-status", string(status)}}))
		return
	}
	_ = proxywasm.SetRequestHeaderBytes("x-callout-status", status)
	_ = proxywasm.SetRequestHeaderBytes("x-callout-body", body)
	// Every header of the answer, in order, each "name: value" and a tab.
	var all []byte
	pairs, _ := proxywasm.GetHTTPCallResponseHeaders()
	for _, kv := range pairs {
		all = append(append(append(append(all, kv[0]...), ": "...), kv[1]...), '\t')
	}
	_ = proxywasm.SetRequestHeaderBytes("x-callout-headers", all)
	if v, err := proxywasm.GetHTTPCallResponseHeaderBytes("x-upstream"); err == nil {
		_ = proxywasm.SetRequestHeaderBytes("x-callout-upstream", v)
	}
	if err := proxywasm.ResumeHTTPRequest(); err != nil {
		proxywasm.LogError("resume: " + err.Error())
	}
}

// Streams are pooled so the hot path does not allocate a context per request.
var free []*stream

func (r *root) NewHTTPContext(id uint32) proxywasm.HTTPContext {
	var s *stream
	if n := len(free); n > 0 {
		s, free = free[n-1], free[:n-1]
	} else {
		s = &stream{}
	}
	*s = stream{id: id, root: r}
	return s
}

type mode uint8

const (
	modeNone mode = iota
	modeEcho
	modeDeny
	modeCallout
	modeShared
	modeTrap
	modeLog
	modeHot
	modeMallocs
	modeRespDeny
	modeTrapResponse
	modePanic
	modeExit
	modeWASI
	modeRaw
	modeTick
	modeAllocRestricted
	modeBody
)

var modes = map[string]mode{
	"echo": modeEcho, "deny": modeDeny, "callout": modeCallout, "shared": modeShared,
	"trap": modeTrap, "log": modeLog, "hot": modeHot, "mallocs": modeMallocs,
	"respdeny": modeRespDeny, "trap-response": modeTrapResponse, "panic": modePanic,
	"exit": modeExit, "wasi": modeWASI, "raw": modeRaw, "tick": modeTick,
	"alloc-restricted": modeAllocRestricted, "body": modeBody,
}

type stream struct {
	proxywasm.DefaultHTTPContext
	id   uint32
	root *root
	mode mode
}

func header(name string) string {
	v, _ := proxywasm.GetRequestHeader(name)
	return v
}

func (s *stream) OnRequestHeaders(numHeaders int, endOfStream bool) proxywasm.Action {
	m, err := proxywasm.GetRequestHeaderBytes("x-mode")
	if err != nil {
		return proxywasm.Continue
	}
	s.mode = modes[string(m)] // map lookup with a converted key does not allocate
	switch s.mode {
	case modeEcho:
		return s.echo(numHeaders, endOfStream)
	case modeDeny:
		_ = proxywasm.SendLocalResponse(429, "rate_limited", []byte("denied"), proxywasm.AppendHeaderMap(nil, [][2]string{{"x-reason", "test"}, {"retry-after", "7"}}))
		return proxywasm.Pause
	case modeCallout:
		return s.callout()
	case modeShared:
		return s.shared()
	case modeTrap:
		trap()
	case modePanic:
		panic("deliberate panic") // the binding recovers it
	case modeExit:
		wasiProcExit(3)
	case modeWASI:
		wasiProbe()
	case modeRaw:
		rawProbe()
	case modeTick:
		if err := proxywasm.SetTickPeriod(5); err != nil {
			_ = proxywasm.SetRequestHeader("x-tick-error", err.Error())
		}
	case modeAllocRestricted:
		restrictAlloc = true
		_, _ = proxywasm.GetRequestHeaderBytes("x-mode") // the host allocates
		restrictAlloc = false
	case modeLog:
		lvl, _ := strconv.Atoi(header("x-log-level"))
		_ = proxywasm.Log(proxywasm.LogLevel(lvl), header("x-log"))
	case modeHot:
		if _, err := proxywasm.GetRequestHeaderBytes("x-user"); err != nil {
			return proxywasm.Continue
		}
		if _, err := proxywasm.GetProperty("source", "address"); err != nil {
			return proxywasm.Continue
		}
		_ = proxywasm.IncrementMetric(hotCounter, 1)
		_, _, _ = proxywasm.GetSharedData("hot")
		_ = proxywasm.SetRequestHeader("x-hot", "1")
	case modeMallocs:
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		_ = proxywasm.SetRequestHeader("x-mallocs", strconv.FormatUint(ms.Mallocs, 10))
	}
	return proxywasm.Continue
}

func (s *stream) echo(numHeaders int, endOfStream bool) proxywasm.Action {
	_ = proxywasm.IncrementMetric(requests, 1)
	_ = proxywasm.RecordMetric(gauge, 42)
	_ = proxywasm.RecordMetric(hist, 7)
	set := func(k, v string) {
		if err := proxywasm.SetRequestHeader(k, v); err != nil {
			proxywasm.LogError("set " + k + ": " + err.Error())
		}
	}
	set("x-config", config)
	set("x-vm-config", vmConfig)
	set("x-num-headers", strconv.Itoa(numHeaders))
	set("x-eos", strconv.FormatBool(endOfStream))
	_ = proxywasm.AddRequestHeader("x-added", "a")
	_ = proxywasm.AddRequestHeader("x-added", "b")
	_ = proxywasm.RemoveRequestHeader("x-remove-me")
	for _, p := range []string{"source.address", "request.path", "request.url_path", "request.method",
		"request.host", "request.scheme", "request.protocol", "request.id", "plugin_root_id", "plugin_name", "plugin_vm_id",
		"connection.uri_san_peer_certificate", "connection.dns_san_peer_certificate"} {
		v, err := proxywasm.GetProperty(splitDots(p)...)
		if err != nil {
			set("x-prop-"+p, "error: "+err.Error())
			continue
		}
		set("x-prop-"+p, string(v))
	}
	for _, p := range []string{"source.port", "connection.id"} {
		v, err := proxywasm.GetProperty(splitDots(p)...)
		n, ok := proxywasm.PropertyInt64(v)
		if err != nil || !ok {
			set("x-prop-"+p, "error")
			continue
		}
		set("x-prop-"+p, strconv.FormatInt(n, 10))
	}
	if _, err := proxywasm.GetProperty("no", "such"); !errors.Is(err, proxywasm.ErrNotFound) {
		set("x-prop-missing", "unexpected")
	}
	now, _ := proxywasm.GetCurrentTimeNanos()
	set("x-now", strconv.FormatInt(now, 10))
	hs, _ := proxywasm.GetRequestHeaders()
	set("x-pairs", strconv.Itoa(len(hs)))
	if v, err := proxywasm.GetMetric(requests); err == nil {
		set("x-metric-requests", strconv.FormatUint(v, 10))
	}
	if err := proxywasm.IncrementMetric(requests, -1); !errors.Is(err, proxywasm.ErrBadArgument) {
		set("x-counter-negative", "accepted")
	}
	return proxywasm.Continue
}

func splitDots(p string) []string {
	var out []string
	start := 0
	for i := 0; i < len(p); i++ {
		if p[i] == '.' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return append(out, p[start:])
}

func (s *stream) callout() proxywasm.Action {
	cluster := header("x-cluster")
	if cluster == "" {
		cluster = "backend"
	}
	path := header("x-callout-path")
	if path == "" {
		path = "/check"
	}
	timeout := uint32(1000)
	if t := header("x-timeout"); t != "" {
		n, _ := strconv.Atoi(t)
		timeout = uint32(n)
	}
	method := header("x-callout-method")
	if method == "" {
		method = "POST"
	}
	body := []byte("payload")
	if b, err := proxywasm.GetRequestHeaderBytes("x-callout-send-body"); err == nil {
		body = b
	}
	if n, err := strconv.Atoi(header("x-callout-send-body-times")); err == nil {
		body = []byte(strings.Repeat(string(body), n))
	}
	headers := [][2]string{{":method", method}, {":path", path}, {":authority", "backend.local"}, {"x-from", "guest"}}
	// The request's x-callout-header-<name> go out as <name>.
	pairs, _ := proxywasm.GetRequestHeaders()
	for _, kv := range pairs {
		if name, ok := strings.CutPrefix(kv[0], "x-callout-header-"); ok {
			headers = append(headers, [2]string{name, kv[1]})
		}
	}
	id, err := proxywasm.DispatchHTTPCall(cluster, headers, body, nil, timeout)
	if err != nil {
		_ = proxywasm.SendLocalResponse(502, "dispatch_failed", []byte(err.Error()), nil)
		return proxywasm.Pause
	}
	if header("x-then") == "continue" {
		return proxywasm.Continue // its answer is not waited for
	}
	s.root.pending[id] = s
	return proxywasm.Pause
}

func (s *stream) shared() proxywasm.Action {
	key := header("x-key")
	old, cas, err := proxywasm.GetSharedData(key)
	switch {
	case errors.Is(err, proxywasm.ErrNotFound):
		_ = proxywasm.SetRequestHeader("x-shared-old", "<none>")
	case err != nil:
		_ = proxywasm.SetRequestHeader("x-shared-old", "error: "+err.Error())
	default:
		_ = proxywasm.SetRequestHeaderBytes("x-shared-old", old)
	}
	_ = proxywasm.SetRequestHeader("x-shared-cas", strconv.FormatUint(uint64(cas), 10))
	if c := header("x-cas"); c != "" {
		n, _ := strconv.ParseUint(c, 10, 32)
		cas = uint32(n)
	}
	res := "ok"
	if err := proxywasm.SetSharedData(key, []byte(header("x-value")), cas); err != nil {
		res = err.Error()
	}
	_ = proxywasm.SetRequestHeader("x-shared-result", res)
	return proxywasm.Continue
}

func (s *stream) OnResponseHeaders(numHeaders int, endOfStream bool) proxywasm.Action {
	switch s.mode {
	case modeEcho:
		st, _ := proxywasm.GetResponseHeader(":status")
		_ = proxywasm.AddResponseHeader("x-guest-saw-status", st)
		_ = proxywasm.SetResponseHeader("x-replaced", "new")
		_ = proxywasm.RemoveResponseHeader("x-secret")
	case modeHot:
		_ = proxywasm.AddResponseHeader("x-hot", "1")
	case modeRespDeny:
		_ = proxywasm.SendLocalResponse(502, "upstream_rejected", []byte("replaced"), nil)
		return proxywasm.Pause
	case modeTrapResponse:
		trap()
	case modeBody:
		_ = proxywasm.Log(proxywasm.LogLevelInfo, "headers end_of_stream="+strconv.FormatBool(endOfStream))
	case modeDeny:
		// The local reply passes through this callback, as in Envoy.
		st, _ := proxywasm.GetResponseHeader(":status")
		_ = proxywasm.AddResponseHeader("x-saw-local", st)
	}
	return proxywasm.Continue
}

// OnResponseBody logs the body it is given: its size, whether it ends the
// stream, the sizes of the parts VisitHTTPResponseBody read it in, and
// its text (cut in the middle past 32 bytes).
func (s *stream) OnResponseBody(size int, endOfStream bool) proxywasm.Action {
	if s.mode == modeBody {
		var parts bodyParts
		if err := proxywasm.VisitHTTPResponseBody(size, &parts); err != nil {
			parts = append(parts, "error: "+err.Error())
		}
		var lens []string
		for _, p := range parts {
			lens = append(lens, strconv.Itoa(len(p)))
		}
		text := strings.Join(parts, "")
		if len(text) > 32 {
			text = text[:16] + "..." + text[len(text)-16:]
		}
		_ = proxywasm.Log(proxywasm.LogLevelInfo, "body "+strconv.Itoa(size)+" end_of_stream="+strconv.FormatBool(endOfStream)+
			" parts="+strings.Join(lens, ",")+" "+text)
	}
	return proxywasm.Continue
}

type bodyParts []string

func (p *bodyParts) Write(b []byte) (int, error) {
	*p = append(*p, string(b))
	return len(b), nil
}

func (s *stream) OnLog() {
	if s.mode != modeNone {
		_ = proxywasm.IncrementMetric(logs, 1)
	}
}

func (s *stream) OnDone() {
	if s.mode != modeNone {
		_ = proxywasm.IncrementMetric(deletes, 1)
	}
	*s = stream{}
	free = append(free, s)
}
