package proxywasm

import "errors"

// Action is what a stream callback tells the host to do next.
type Action uint32

const (
	// Continue lets the host pass the headers or data on.
	Continue Action = 0
	// Pause stops processing until ResumeHTTPRequest/ResumeHTTPResponse
	// or SendLocalResponse.
	Pause Action = 1
)

// LogLevel is a proxy_log level.
type LogLevel uint32

const (
	LogLevelTrace LogLevel = iota
	LogLevelDebug
	LogLevelInfo
	LogLevelWarn
	LogLevelError
	LogLevelCritical
)

func (l LogLevel) String() string {
	switch l {
	case LogLevelTrace:
		return "trace"
	case LogLevelDebug:
		return "debug"
	case LogLevelInfo:
		return "info"
	case LogLevelWarn:
		return "warn"
	case LogLevelError:
		return "error"
	case LogLevelCritical:
		return "critical"
	}
	return "unknown"
}

// MetricType is the kind of a metric defined with DefineMetric.
type MetricType uint32

const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// Status is a proxy_status_t returned by every host call.
type Status uint32

const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCASMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// Errors for non-OK statuses. Compare with errors.Is.
var (
	ErrNotFound             = errors.New("proxywasm: not found")
	ErrBadArgument          = errors.New("proxywasm: bad argument")
	ErrSerializationFailure = errors.New("proxywasm: serialization failure")
	ErrParseFailure         = errors.New("proxywasm: parse failure")
	ErrInvalidMemoryAccess  = errors.New("proxywasm: invalid memory access")
	ErrEmpty                = errors.New("proxywasm: empty")
	ErrCASMismatch          = errors.New("proxywasm: CAS mismatch")
	ErrInternalFailure      = errors.New("proxywasm: internal failure")
	ErrUnimplemented        = errors.New("proxywasm: unimplemented")
	ErrUnknownStatus        = errors.New("proxywasm: unknown status")
)

// Err maps a status to its error; StatusOK maps to nil. The errors are
// package variables, so mapping does not allocate. A table rather than a
// switch keeps Err cheap enough for the compiler to inline the host-call
// wrappers that end in it, on every request.
func (s Status) Err() error {
	if int(s) < len(statusErrs) {
		return statusErrs[s]
	}
	return ErrUnknownStatus
}

var statusErrs = [...]error{
	StatusOK:                   nil,
	StatusNotFound:             ErrNotFound,
	StatusBadArgument:          ErrBadArgument,
	StatusSerializationFailure: ErrSerializationFailure,
	StatusParseFailure:         ErrParseFailure,
	5:                          ErrUnknownStatus,
	StatusInvalidMemoryAccess:  ErrInvalidMemoryAccess,
	StatusEmpty:                ErrEmpty,
	StatusCASMismatch:          ErrCASMismatch,
	9:                          ErrUnknownStatus,
	StatusInternalFailure:      ErrInternalFailure,
	11:                         ErrUnknownStatus,
	StatusUnimplemented:        ErrUnimplemented,
}

// ABI enumerations used on the wire.
const (
	mapRequestHeaders      = 0
	mapResponseHeaders     = 2
	mapHTTPCallRespHeaders = 6

	bufferHTTPResponseBody     = 1
	bufferHTTPCallResponseBody = 4
	bufferVMConfiguration      = 6
	bufferPluginConfiguration  = 7

	streamHTTPRequest  = 0
	streamHTTPResponse = 1
)

// VMContext is the plugin's per-VM entry point, registered with SetVMContext.
type VMContext interface {
	// OnVMStart is called once per VM; false marks the VM unusable.
	OnVMStart(vmConfigSize int) bool
	// NewPluginContext creates the root context contextID.
	NewPluginContext(contextID uint32) PluginContext
}

// PluginContext is a root context: configuration, timers and call-out
// responses are delivered to it.
type PluginContext interface {
	// OnPluginStart is called on every configuration; false refuses it.
	OnPluginStart(configSize int) bool
	// OnPluginDone returns true when the context may be deleted now.
	// Called only in a plugin that exports proxy_on_done (ProxyOnDone);
	// without it the host deletes the context at once.
	OnPluginDone() bool
	OnTick()
	// OnHTTPCallResponse delivers the answer to DispatchHTTPCall. numHeaders
	// == 0 means the call failed (timeout, connection error). Call
	// SetEffectiveContext before touching the HTTP stream it belongs to.
	OnHTTPCallResponse(calloutID uint32, numHeaders, bodySize, numTrailers int)
	// NewHTTPContext creates the stream context contextID.
	NewHTTPContext(contextID uint32) HTTPContext
}

// HTTPContext is one HTTP request/response pair.
type HTTPContext interface {
	OnRequestHeaders(numHeaders int, endOfStream bool) Action
	OnResponseHeaders(numHeaders int, endOfStream bool) Action
	// OnLog is called once the stream is done, before OnDone's deletion,
	// in a plugin that exports proxy_on_log (ProxyOnLog).
	OnLog()
	// OnDone is called when the host deletes the context.
	OnDone()
}

// PanicHandler is implemented by a root context that answers for a
// callback that panicked. A Go panic that escapes a callback traps the VM,
// and the proxy then fails every later request of that worker (under
// Envoy's WASI the panic message is lost too), so the binding recovers
// every callback, logs the panic with its stack at critical level, and
// asks the root context what to do. stream is the HTTP context whose
// callback panicked, nil for a callback of the root context itself. For a
// header callback OnPanic returns the action to give the host; a stream
// paused for a call-out whose answer was being handled when the panic came
// must be resumed or answered by OnPanic itself.
type PanicHandler interface {
	OnPanic(contextID uint32, stream HTTPContext, value any) Action
}

// Optional stream callbacks. An HTTPContext implementing one of these
// receives the matching callback; otherwise the host is told to continue.
// The request body and trailers callbacks come only in a plugin that
// exports them (ProxyOnRequestBody, ProxyOnRequestTrailers,
// ProxyOnResponseTrailers); the response body callback always does.
type (
	RequestBodyHandler interface {
		OnRequestBody(bodySize int, endOfStream bool) Action
	}
	RequestTrailersHandler interface {
		OnRequestTrailers(numTrailers int) Action
	}
	ResponseBodyHandler interface {
		OnResponseBody(bodySize int, endOfStream bool) Action
	}
	ResponseTrailersHandler interface {
		OnResponseTrailers(numTrailers int) Action
	}
)

// DefaultVMContext can be embedded to get no-op VMContext methods.
type DefaultVMContext struct{}

func (DefaultVMContext) OnVMStart(int) bool { return true }
func (DefaultVMContext) NewPluginContext(uint32) PluginContext {
	return DefaultPluginContext{}
}

// DefaultPluginContext can be embedded to get no-op PluginContext methods.
type DefaultPluginContext struct{}

func (DefaultPluginContext) OnPluginStart(int) bool                   { return true }
func (DefaultPluginContext) OnPluginDone() bool                       { return true }
func (DefaultPluginContext) OnTick()                                  {}
func (DefaultPluginContext) OnHTTPCallResponse(uint32, int, int, int) {}
func (DefaultPluginContext) NewHTTPContext(uint32) HTTPContext        { return DefaultHTTPContext{} }

// DefaultHTTPContext can be embedded to get no-op HTTPContext methods.
type DefaultHTTPContext struct{}

func (DefaultHTTPContext) OnRequestHeaders(int, bool) Action  { return Continue }
func (DefaultHTTPContext) OnResponseHeaders(int, bool) Action { return Continue }
func (DefaultHTTPContext) OnLog()                             {}
func (DefaultHTTPContext) OnDone()                            {}
