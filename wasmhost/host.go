package wasmhost

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/sluicehq/sluice/internal/rawsock"
)

// Errors a request or the host can fail with. Compare with errors.Is.
var (
	// ErrPluginFailed: a VM trapped while it was being configured. (A VM
	// that fails during a request is not an error of the request: the
	// request gets what Options.FailurePolicy says.)
	ErrPluginFailed = errors.New("wasmhost: plugin VM failed")
	// ErrConfigRefused: a VM's proxy_on_configure returned false.
	ErrConfigRefused = errors.New("wasmhost: plugin refused the configuration")
	// ErrStreamReset: the plugin closed the stream (proxy_close_stream).
	ErrStreamReset = errors.New("wasmhost: plugin reset the stream")
	// ErrClosed: the host is closed.
	ErrClosed = errors.New("wasmhost: host closed")
)

// Options configure a Host. Zero values are usable.
type Options struct {
	Workers      int    // worker VMs, default 2
	PluginConfig []byte // passed to proxy_on_configure
	VMConfig     []byte // passed to proxy_on_vm_start
	RootID       string // property plugin_root_id
	PluginName   string // property plugin_name, default "sluice"
	VMID         string // property plugin_vm_id
	// Environment is what the VM sees as its environment variables, as
	// Envoy's vm_config.environment_variables: nothing else of the host's
	// environment reaches the plugin.
	Environment map[string]string
	// Clusters maps upstream cluster names used by proxy_http_call to base
	// URLs, e.g. "sluice_bridge" → "http://127.0.0.1:8081", or to a Unix
	// socket, "unix:///run/sluice/bridge.sock" (as an Envoy cluster with a
	// pipe address; the host's own client sends those call-outs, whatever
	// HTTPClient says).
	Clusters map[string]string
	// Handlers serves the call-outs to each cluster named here with its
	// handler, in this process: no connection, as for a service embedded
	// in the proxy (cmd/gateway's --embed-bridge). The handler sees the
	// request as a server would, with the call-out's timeout as its
	// context's deadline, and should return once that ends: the plugin
	// gets its 504 then. A handler that is also an inproc.Server
	// (internal/inproc; the bridge's, redisbridge.Server.Handler) answers
	// the call-outs it serves from their bytes instead, without net/http's
	// request and response. A name may not also be in Clusters.
	Handlers map[string]http.Handler
	// HTTPClient, when set, sends every call-out. By default call-outs to
	// plain-HTTP clusters go through the host's own HTTP/1.1 client
	// (h1client.go) and those to https clusters through a client with its
	// own transport, which follows no redirect: Envoy's async client hands
	// the plugin a 3xx as it came.
	HTTPClient *http.Client
	// TLSClientConfig is the TLS client configuration of https clusters:
	// its RootCAs verify their certificates, as an Envoy cluster's
	// validation_context trusted_ca; nil: the system's roots. Not used
	// with HTTPClient.
	TLSClientConfig *tls.Config
	// Logger receives plugin logs (proxy_log and the guest's stderr).
	Logger *slog.Logger
	// OnLog, when set, is called with every plugin log entry.
	OnLog func(LogEntry)
	// LogCapacity bounds the entries Logs returns (the newest are kept), default 4096.
	LogCapacity int
	// LogLevel is what proxy_get_log_level reports; lower levels are dropped.
	LogLevel LogLevel
	// FailurePolicy is what requests get from a VM that has failed (a trap),
	// as Envoy's PluginConfig.failure_policy; default FailClosed, Envoy's.
	FailurePolicy FailurePolicy
	// ReloadBackoff is the least time between two starts of a VM under
	// FailReload; default 1s, Envoy's ReloadConfig default.
	ReloadBackoff time.Duration
	// Now is the proxy's clock: proxy_get_current_time_nanoseconds and the
	// WASI realtime clock read it, as both read Envoy's time source.
	// Default time.Now.
	Now func() time.Time
	// MaxCalloutBody bounds a call-out response body, default 1 MiB.
	MaxCalloutBody int64
	// CompilationCache is shared by hosts so that a module is compiled once
	// per process; default: one in-memory cache for the whole process.
	// Compiling the plugin takes seconds, restarting a host should not.
	CompilationCache wazero.CompilationCache
	// MeasureGuest accounts the time spent executing guest code, apart
	// from host functions, for GuestTime. It costs two clock reads per host
	// call; for benchmarks. What a clock read itself costs (clockCost) is
	// not counted as the guest's.
	MeasureGuest bool
}

// FailurePolicy says what a request gets from a VM that has failed.
type FailurePolicy int

const (
	// FailClosed answers 503 with an empty body (Envoy's failStream) and
	// keeps the VM failed.
	FailClosed FailurePolicy = iota
	// FailOpen lets requests pass as if the plugin were not there, and
	// keeps the VM failed.
	FailOpen
	// FailReload starts a new VM for a later request, at most once per
	// ReloadBackoff; meanwhile requests get FailClosed's answer.
	FailReload
)

func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "fail_closed"
	case FailOpen:
		return "fail_open"
	case FailReload:
		return "fail_reload"
	}
	return "unknown"
}

var processCache = wazero.NewCompilationCache()

// noRedirect makes an http.Client hand back a redirect as it came.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Host runs a proxy-wasm plugin. It is safe for concurrent use.
type Host struct {
	opts     Options
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	vms      []*vm
	next     atomic.Uint32
	client   *http.Client
	clusters map[string]*cluster // Options.Clusters
	h1       *h1client           // call-outs to plain-HTTP clusters (h1client.go)
	workers  calloutWorkers

	cfgMu  sync.Mutex // serializes Configure
	stMu   sync.Mutex // guards config
	config []byte

	shared   sharedStore
	metrics  metricStore
	logs     logStore
	failures atomic.Int64
	// provided is every host function by "module.name"; environ is the
	// VM environment as WASI environ_get hands it out ("k=v\0").
	provided map[string]bool
	environ  [][]byte
	started  time.Time
	// guestNanos is guest execution time with MeasureGuest.
	guestNanos atomic.Int64
	// clockCost is what a clock read costs, with MeasureGuest.
	clockCost int64

	ctx    context.Context // cancelled by Close; ends call-outs and timers
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	connID atomic.Uint64
}

// New compiles wasm and starts opts.Workers VMs, each initialized, started
// and configured with opts.PluginConfig.
func New(ctx context.Context, wasm []byte, opts Options) (*Host, error) {
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if opts.PluginName == "" {
		opts.PluginName = "sluice"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.LogCapacity <= 0 {
		opts.LogCapacity = 4096
	}
	if opts.MaxCalloutBody <= 0 {
		opts.MaxCalloutBody = 1 << 20
	}
	if opts.ReloadBackoff <= 0 {
		opts.ReloadBackoff = time.Second
	}
	var err error
	h := &Host{opts: opts, client: opts.HTTPClient, config: opts.PluginConfig,
		provided: map[string]bool{}, started: time.Now()}
	if opts.MeasureGuest {
		h.clockCost = clockCost()
	}
	for _, k := range sortedKeys(opts.Environment) {
		h.environ = append(h.environ, []byte(k+"="+opts.Environment[k]+"\x00"))
	}
	if h.client == nil {
		t := NewTransport()
		// Call-outs to HTTPS clusters go through it: their connections
		// raw, as the plain-HTTP clusters' are (h1pool).
		t.DialContext = rawsock.DialContext(t.DialContext)
		if opts.TLSClientConfig != nil {
			t.TLSClientConfig = opts.TLSClientConfig.Clone()
		}
		h.client = &http.Client{Transport: t, CheckRedirect: noRedirect}
	}
	h.h1 = &h1client{}
	if h.clusters, err = h.newClusters(); err != nil {
		return nil, err
	}
	h.workers.h = h
	h.shared.init()
	h.metrics.init()
	h.logs.cap = opts.LogCapacity
	h.ctx, h.cancel = context.WithCancel(context.Background())

	// NewRuntimeConfig picks the compiler where wazero supports it and the
	// interpreter elsewhere.
	if opts.CompilationCache == nil {
		opts.CompilationCache = processCache
	}
	rc := wazero.NewRuntimeConfig().WithCompilationCache(opts.CompilationCache)
	h.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if err := h.instantiateWASI(ctx); err != nil {
		h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: wasi: %w", err)
	}
	if err := h.exportHostFunctions(ctx); err != nil {
		h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: host functions: %w", err)
	}
	compiled, err := h.rt.CompileModule(ctx, wasm)
	if err != nil {
		h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: compile: %w", err)
	}
	if err := h.checkImports(compiled); err != nil {
		h.rt.Close(ctx)
		return nil, fmt.Errorf("wasmhost: %w", err)
	}
	if _, ok := compiled.ExportedFunctions()["proxy_abi_version_0_2_1"]; !ok {
		h.rt.Close(ctx)
		return nil, errors.New("wasmhost: module does not export proxy_abi_version_0_2_1")
	}
	h.compiled = compiled
	for i := 0; i < opts.Workers; i++ {
		v := &vm{h: h, idx: i}
		// Hold the VM: a timer the plugin starts in proxy_on_configure may fire at once.
		v.mu.Lock()
		in, err := h.newInstance(v)
		v.inst = in
		v.mu.Unlock()
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("wasmhost: vm %d: %w", i, err)
		}
		h.vms = append(h.vms, v)
	}
	return h, nil
}

func (h *Host) currentConfig() []byte {
	h.stMu.Lock()
	defer h.stMu.Unlock()
	return h.config
}

func (h *Host) setConfig(cfg []byte) {
	h.stMu.Lock()
	h.config = cfg
	h.stMu.Unlock()
}

// Configure sends cfg to proxy_on_configure of every VM. When any VM
// refuses it, every VM is configured again with the previous
// configuration, which stays current, and the error wraps ErrConfigRefused.
func (h *Host) Configure(ctx context.Context, cfg []byte) error {
	if h.closed.Load() {
		return ErrClosed
	}
	h.cfgMu.Lock()
	defer h.cfgMu.Unlock()
	cfg = append([]byte(nil), cfg...)
	prev := h.currentConfig()
	h.setConfig(cfg)
	var failed error
	for _, v := range h.vms {
		if err := v.configure(cfg); err != nil {
			failed = fmt.Errorf("vm %d: %w", v.idx, err)
			break
		}
	}
	if failed == nil {
		return nil
	}
	h.setConfig(prev)
	for _, v := range h.vms {
		if err := v.configure(prev); err != nil {
			h.log(v.idx, LogLevelError, "host: restoring the previous configuration: "+err.Error())
		}
	}
	return fmt.Errorf("wasmhost: configure: %w", failed)
}

// Failures returns how many times a VM has failed (trapped).
func (h *Host) Failures() int64 { return h.failures.Load() }

// clockCost is the median time between two clock reads in a row, which
// is what measuring an interval adds to it: a guest making a host call
// would otherwise be charged for the host's clock reads around it.
func clockCost() int64 {
	var d [1001]int64
	for i := range d {
		start := time.Now()
		d[i] = time.Since(start).Nanoseconds()
	}
	slices.Sort(d[:])
	return d[len(d)/2]
}

// GuestTime returns the time spent executing guest code, host functions
// excluded, since the host started; zero unless Options.MeasureGuest.
func (h *Host) GuestTime() time.Duration { return time.Duration(h.guestNanos.Load()) }

// MemorySizes returns each worker VM's linear memory size in bytes (0 for
// a VM that is being replaced): a guest heap that grows per request shows
// here.
func (h *Host) MemorySizes() []uint32 {
	out := make([]uint32, len(h.vms))
	for i, v := range h.vms {
		v.mu.Lock()
		if v.inst != nil {
			out[i] = v.inst.mod.Memory().Size()
		}
		v.mu.Unlock()
	}
	return out
}

// Workers returns the number of worker VMs.
func (h *Host) Workers() int { return len(h.vms) }

// Metric returns the value of a counter or gauge, or the number of samples
// of a histogram, summed over all VMs as Envoy's shared stats are.
func (h *Host) Metric(name string) (int64, bool) { return h.metrics.value(name) }

// MetricNames returns the names of every metric the plugin defined, sorted.
// Envoy exports each from the moment it is defined, at zero until it
// changes, as wasmcustom.<name>; its Prometheus output drops that prefix.
func (h *Host) MetricNames() []string { return h.metrics.names() }

// MetricType returns the type a metric was defined with.
func (h *Host) MetricType(name string) (MetricType, bool) { return h.metrics.typeOf(name) }

// Histogram returns the samples recorded in a histogram.
func (h *Host) Histogram(name string) []uint64 { return h.metrics.samples(name) }

// SharedData returns a copy of the value stored under key and its CAS token.
func (h *Host) SharedData(key string) ([]byte, uint32, bool) { return h.shared.get(key) }

// SharedDataLen returns how many keys the shared data holds: proxy-wasm
// ABI 0.2.1 cannot delete them, so a plugin must bound the keys it writes.
func (h *Host) SharedDataLen() int { return h.shared.len() }

// Logs returns the newest plugin log entries, oldest first.
func (h *Host) Logs() []LogEntry { return h.logs.snapshot() }

// Close stops timers and call-outs, fails paused streams with ErrClosed and
// releases the VMs.
func (h *Host) Close() error {
	if h.closed.Swap(true) {
		return nil
	}
	h.cancel()
	h.h1.close()
	h.workers.close()
	for _, v := range h.vms {
		v.mu.Lock()
		if v.inst != nil {
			v.inst.stopTick()
			v.inst.failStreams(ErrClosed)
		}
		v.mu.Unlock()
	}
	h.wg.Wait()
	for _, v := range h.vms {
		v.mu.Lock()
		if v.inst != nil {
			v.inst.dead = true
			_ = v.inst.mod.Close(context.Background())
			v.inst = nil
		}
		v.mu.Unlock()
	}
	return h.rt.Close(context.Background())
}

// pick returns the VM for a new stream, round robin.
func (h *Host) pick() *vm {
	return h.vms[int(h.next.Add(1)-1)%len(h.vms)]
}
