// Package v8host runs a proxy-wasm plugin on V8, the engine Envoy uses by
// default, with a host of the project's own that behaves as Envoy's
// (proxy-wasm-cpp-host at the commits Envoy 1.33 to 1.38 pin, and Envoy's
// Wasm context): the same WASI and env imports and nothing more, the same
// status codes, allow-lists during _initialize and allocation, NUL-separated
// property paths, deferred local replies that run through the plugin's own
// on_response_headers, and Envoy's failure policy for a VM that trapped.
//
// The host is host.mjs, run by Node.js (Debian's nodejs) with V8 flagged as
// Envoy flags it (no Liftoff, a 1 GiB memory limit); this package starts
// it and talks to it. One Host is one proxy: several worker VMs of one
// module that share shared data and metrics. All Hosts of a process share
// one Node process, so that V8 compiles a module once (a start then takes
// milliseconds, not most of a second); it ends with the Go process.
package v8host

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

//go:embed host.mjs
var hostJS []byte

// Node's V8 flags as proxy-wasm-cpp-host sets them for Envoy (src/v8/v8.cc
// engine()): optimized code only, and memory capped at 1 GiB
// (include/proxy-wasm/limits.h).
var nodeArgs = []string{"--no-liftoff", "--wasm-max-mem-pages=16384", "--no-warnings", "--input-type=module", "--eval"}

// LogLevel is a proxy-wasm log level (Envoy's spdlog levels).
type LogLevel uint32

// Log levels.
const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// LogEntry is one log line of a VM: proxy_log, the guest's stdout (info)
// and stderr (error), and the host's own messages about the VM (its
// failure, at error). VM is -1 for a module that could not be loaded.
type LogEntry struct {
	VM      int
	Level   LogLevel
	Message string
}

// Options configure a Host.
type Options struct {
	Workers      int    // worker VMs, default 2
	PluginConfig []byte // what proxy_on_configure reads
	VMConfig     []byte // what proxy_on_vm_start reads
	RootID       string // property plugin_root_id
	VMID         string // property plugin_vm_id
	PluginName   string // property plugin_name, default "sluice"
	// Environment is the VM's environment (Envoy's
	// vm_config.environment_variables), and nothing else.
	Environment map[string]string
	// Clusters maps the cluster names of proxy_http_call to base URLs.
	Clusters map[string]string
	// FailOpen is Envoy's fail_open: a request on a failed VM passes;
	// otherwise it gets a 503 with an empty body.
	FailOpen bool
	// LogLevel is the proxy's log level: proxy_get_log_level reports it and
	// lower entries are dropped. The zero value is trace.
	LogLevel LogLevel
	// MaxCalloutBody bounds a call-out response body; a longer one is a
	// failed call-out. Default 1 MiB.
	MaxCalloutBody int
	// OnLog, when set, sees every log entry as it arrives.
	OnLog func(LogEntry)
}

// Request is one downstream request and, when the plugin lets it through,
// the upstream's answer.
type Request struct {
	Method        string // default GET
	Path          string // :path, query included
	Authority     string
	Scheme        string // default http
	Headers       [][2]string
	SourceAddress string // "ip:port", property source.address
	RequestID     string // x-request-id when the headers have none; else Envoy's generated UUID
	Protocol      string // default HTTP/1.1
	// UpstreamStatus and UpstreamHeaders are the upstream's answer (200
	// without headers by default), and UpstreamBody its body, in the parts
	// it sends (none: the headers end the stream). UpstreamCut: the body
	// stops after its parts, without the end of the stream (a reset).
	UpstreamStatus  int
	UpstreamHeaders [][2]string
	UpstreamBody    []string
	UpstreamCut     bool
}

// Response is what the client got.
type Response struct {
	VM      int // the worker that ran the request
	Status  int
	Headers [][2]string // as sent downstream, ":status" first
	Body    []byte
	// Local: answered by the proxy (the plugin's local response or a failed
	// VM's 503), not by the upstream.
	Local bool
	// Details is Envoy's response code details: the plugin's, via_upstream,
	// wasm_fail_stream, wasm_close_stream.
	Details string
	Reset   bool // the stream was reset (proxy_close_stream)
	Failed  bool // the VM had failed by the time the request ended
	// UpstreamRequest is the request as the upstream got it (the plugin's
	// changes included), nil when it did not get there.
	UpstreamRequest [][2]string
}

// Header returns the first value of a response header.
func (r Response) Header(name string) (string, bool) {
	for _, kv := range r.Headers {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// BenchResult is the cost of one request measured inside Node: the
// plugin's code (every module call of the request, host functions
// excluded), the whole request in Node, and Node's CPU time.
type BenchResult struct {
	GuestNs float64 `json:"guestNs"`
	WallNs  float64 `json:"wallNs"`
	CPUNs   float64 `json:"cpuNs"`
}

// Host is a proxy running a plugin. Its methods are safe for concurrent use.
type Host struct {
	opts Options
	n    *node
	id   uint64

	mu     sync.Mutex
	logs   []LogEntry
	fails  []string
	closed atomic.Bool
}

// New loads wasm into opts.Workers VMs and starts and configures each as
// Envoy does. A module Envoy would refuse (an import its host lacks, a
// trap in _initialize, a restricted host call there, a refused
// configuration) is an error here, and the logs say why.
func New(ctx context.Context, wasm []byte, opts Options) (*Host, error) {
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if opts.PluginName == "" {
		opts.PluginName = "sluice"
	}
	if opts.MaxCalloutBody <= 0 {
		opts.MaxCalloutBody = 1 << 20
	}
	n, err := sharedNode()
	if err != nil {
		return nil, err
	}
	key, err := n.load(ctx, wasm)
	if err != nil {
		return nil, err
	}
	h := &Host{opts: opts, n: n, id: n.nextProxy.Add(1)}
	n.register(h)

	env := make([][2]string, 0, len(opts.Environment))
	for k, v := range opts.Environment {
		env = append(env, [2]string{k, v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i][0] < env[j][0] })
	clusters := opts.Clusters
	if clusters == nil {
		clusters = map[string]string{}
	}
	start := map[string]any{
		"wasmKey": key, "workers": opts.Workers, "pluginConfig": string(opts.PluginConfig),
		"vmConfig": string(opts.VMConfig), "rootId": opts.RootID, "vmId": opts.VMID,
		"pluginName": opts.PluginName, "env": env, "clusters": clusters, "failOpen": opts.FailOpen,
		"logLevel": opts.LogLevel, "maxCalloutBody": opts.MaxCalloutBody,
	}
	if err := h.call(ctx, "start", map[string]any{"options": start}, nil); err != nil {
		n.unregister(h)
		return nil, err
	}
	return h, nil
}

// Do runs one request through the plugin on the next worker, round robin,
// and returns what the client got.
func (h *Host) Do(ctx context.Context, r Request) (Response, error) {
	var res struct {
		VM      int         `json:"vm"`
		Status  int         `json:"status"`
		Headers [][2]string `json:"headers"`
		Body    string      `json:"body"`
		Local   bool        `json:"local"`
		Details string      `json:"details"`
		Reset   bool        `json:"reset"`
		Failed  bool        `json:"failed"`
		Up      [][2]string `json:"upstreamRequest"`
	}
	if err := h.call(ctx, "request", map[string]any{"req": wireRequest(r)}, &res); err != nil {
		return Response{}, err
	}
	body, err := base64.StdEncoding.DecodeString(res.Body)
	if err != nil {
		return Response{}, fmt.Errorf("v8host: response body: %w", err)
	}
	return Response{VM: res.VM, Status: res.Status, Headers: res.Headers, Body: body, Local: res.Local,
		Details: res.Details, Reset: res.Reset, Failed: res.Failed, UpstreamRequest: res.Up}, nil
}

// Provided returns every host function a module of ABI 0.2.1 may import,
// as "module.name".
func Provided(ctx context.Context) ([]string, error) {
	n, err := sharedNode()
	if err != nil {
		return nil, err
	}
	var res struct {
		Names []string `json:"names"`
	}
	err = n.call(ctx, "provided", nil, &res)
	return res.Names, err
}

// Bench runs n requests r one after another and reports their cost per
// request, measured inside Node.
func (h *Host) Bench(ctx context.Context, r Request, n int) (BenchResult, error) {
	var res BenchResult
	err := h.call(ctx, "bench", map[string]any{"req": wireRequest(r), "n": n}, &res)
	return res, err
}

// Metrics returns every metric the plugin defined: counters and gauges
// by value, histograms by their number of samples, summed over the VMs
// as Envoy's stats are.
func (h *Host) Metrics(ctx context.Context) (map[string]int64, error) {
	var res struct {
		Metrics map[string]int64 `json:"metrics"`
	}
	err := h.call(ctx, "metrics", nil, &res)
	return res.Metrics, err
}

// Logs returns the log entries so far, oldest first.
func (h *Host) Logs() []LogEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]LogEntry(nil), h.logs...)
}

// Failures returns the message of every VM failure so far (a trap, a
// restricted host call, proc_exit), as Envoy logs it.
func (h *Host) Failures() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.fails...)
}

// Close stops the proxy: its timers and VMs. Call-outs in flight are
// dropped.
func (h *Host) Close() error {
	if h.closed.Swap(true) {
		return nil
	}
	err := h.call(context.Background(), "stop", nil, nil)
	h.n.unregister(h)
	return err
}

func (h *Host) call(ctx context.Context, op string, args map[string]any, out any) error {
	msg := map[string]any{"proxy": h.id}
	for k, v := range args {
		msg[k] = v
	}
	return h.n.call(ctx, op, msg, out)
}

func (h *Host) event(ev string, vm int, level LogLevel, msg string) {
	switch ev {
	case "log":
		h.addLog(LogEntry{VM: vm, Level: level, Message: msg})
	case "fail":
		h.mu.Lock()
		h.fails = append(h.fails, msg)
		h.mu.Unlock()
	}
}

func (h *Host) addLog(e LogEntry) {
	h.mu.Lock()
	h.logs = append(h.logs, e)
	h.mu.Unlock()
	if h.opts.OnLog != nil {
		h.opts.OnLog(e)
	}
}

func wireRequest(r Request) map[string]any {
	m := map[string]any{"method": r.Method, "path": r.Path, "authority": r.Authority, "scheme": r.Scheme,
		"headers": r.Headers, "source": r.SourceAddress, "requestId": r.RequestID, "protocol": r.Protocol}
	if r.Headers == nil {
		m["headers"] = [][2]string{}
	}
	status := r.UpstreamStatus
	if status == 0 {
		status = 200
	}
	uh := r.UpstreamHeaders
	if uh == nil {
		uh = [][2]string{}
	}
	m["upstream"] = map[string]any{"status": status, "headers": uh, "body": r.UpstreamBody, "cut": r.UpstreamCut}
	return m
}

// node is the Node.js process every Host of this process runs in.
type node struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tail

	wmu       sync.Mutex // serializes writes to stdin
	mu        sync.Mutex // guards the fields below
	pending   map[uint64]chan reply
	hosts     map[uint64]*Host
	loaded    map[string]bool // module keys
	err       error           // why the process ended
	nextID    atomic.Uint64
	nextProxy atomic.Uint64
	done      chan struct{}
}

type reply struct {
	Res   json.RawMessage
	Error string
}

var (
	nodeMu  sync.Mutex
	theNode *node
)

// sharedNode returns the process's Node, starting it (again, if it died).
func sharedNode() (*node, error) {
	nodeMu.Lock()
	defer nodeMu.Unlock()
	if theNode != nil {
		select {
		case <-theNode.done:
		default:
			return theNode, nil
		}
	}
	bin, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("v8host: node not found (Debian package nodejs; `make deps` installs it)")
	}
	n := &node{pending: map[uint64]chan reply{}, hosts: map[uint64]*Host{}, loaded: map[string]bool{},
		done: make(chan struct{}), stderr: &tail{}}
	n.cmd = exec.Command(bin, append(nodeArgs, string(hostJS))...)
	n.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	n.cmd.Stderr = n.stderr
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if n.stdin, err = n.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("v8host: starting node: %w", err)
	}
	go n.read(stdout)
	go func() { <-n.done; _ = n.cmd.Wait() }()
	theNode = n
	return n, nil
}

// load sends a module to Node once; its key names it afterwards.
func (n *node) load(ctx context.Context, wasm []byte) (string, error) {
	sum := sha256.Sum256(wasm)
	key := hex.EncodeToString(sum[:])
	n.mu.Lock()
	done := n.loaded[key]
	n.mu.Unlock()
	if done {
		return key, nil
	}
	if err := n.call(ctx, "load", map[string]any{"key": key, "wasm": wasm}, nil); err != nil {
		return "", err
	}
	n.mu.Lock()
	n.loaded[key] = true
	n.mu.Unlock()
	return key, nil
}

func (n *node) register(h *Host) {
	n.mu.Lock()
	n.hosts[h.id] = h
	n.mu.Unlock()
}

func (n *node) unregister(h *Host) {
	n.mu.Lock()
	delete(n.hosts, h.id)
	n.mu.Unlock()
}

// call sends one operation and waits for its answer.
func (n *node) call(ctx context.Context, op string, args map[string]any, out any) error {
	id := n.nextID.Add(1)
	msg := map[string]any{"id": id, "op": op}
	for k, v := range args {
		msg[k] = v
	}
	line, err := json.Marshal(msg) // []byte values travel as base64
	if err != nil {
		return err
	}
	ch := make(chan reply, 1)
	n.mu.Lock()
	if n.err != nil {
		err := n.err
		n.mu.Unlock()
		return err
	}
	n.pending[id] = ch
	n.mu.Unlock()
	n.wmu.Lock()
	_, err = n.stdin.Write(append(line, '\n'))
	n.wmu.Unlock()
	if err != nil {
		n.forget(id)
		return fmt.Errorf("v8host: %s: %w", op, n.exitErr(err))
	}
	select {
	case r := <-ch:
		if r.Error != "" {
			return fmt.Errorf("v8host: %s: %s", op, r.Error)
		}
		if out != nil {
			return json.Unmarshal(r.Res, out)
		}
		return nil
	case <-n.done:
		return fmt.Errorf("v8host: %s: %w", op, n.exitErr(nil))
	case <-ctx.Done():
		n.forget(id)
		return ctx.Err()
	}
}

func (n *node) forget(id uint64) {
	n.mu.Lock()
	delete(n.pending, id)
	n.mu.Unlock()
}

func (n *node) exitErr(err error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	return err
}

// read dispatches Node's answers and events until its output ends.
func (n *node) read(stdout io.Reader) {
	defer close(n.done)
	r := bufio.NewReaderSize(stdout, 1<<16)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			n.handle(line)
		}
		if err != nil {
			n.mu.Lock()
			if n.err == nil {
				n.err = errors.New("node exited")
				if s := strings.TrimSpace(n.stderr.String()); s != "" {
					n.err = errors.New("node exited: " + s)
				}
			}
			n.mu.Unlock()
			return
		}
	}
}

func (n *node) handle(line []byte) {
	var m struct {
		ID    uint64          `json:"id"`
		Res   json.RawMessage `json:"res"`
		Error string          `json:"error"`
		Ev    string          `json:"ev"`
		Proxy uint64          `json:"proxy"`
		VM    int             `json:"vm"`
		Level LogLevel        `json:"level"`
		Msg   string          `json:"msg"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		fmt.Fprintf(os.Stderr, "v8host: bad line from node: %q\n", line)
		return
	}
	n.mu.Lock()
	if m.Ev == "" {
		ch := n.pending[m.ID]
		delete(n.pending, m.ID)
		n.mu.Unlock()
		if ch != nil {
			ch <- reply{Res: m.Res, Error: m.Error}
		}
		return
	}
	h := n.hosts[m.Proxy]
	n.mu.Unlock()
	if h == nil {
		if m.Ev == "error" {
			fmt.Fprintf(os.Stderr, "v8host: %s\n", m.Msg)
		}
		return
	}
	h.event(m.Ev, m.VM, m.Level, m.Msg)
}

// tail keeps the last few KiB of Node's stderr, for errors.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 8<<10 {
		t.buf = t.buf[len(t.buf)-8<<10:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
