package proxywasm

import (
	"runtime"

	"github.com/sluicehq/sluice/plugin/internal/idmap"
)

// Context bookkeeping behind the exported callbacks. The exports in
// exports_wasip1.go are thin wrappers over these functions so that the
// dispatch logic builds and tests natively.

var (
	vmContext VMContext
	roots     idmap.Map[PluginContext]
	streams   idmap.Map[stream]
)

// stream is an HTTP context and the root context it belongs to, which
// answers for it when a callback panics.
type stream struct {
	HTTPContext
	root uint32
	// skipResponse: the context has nothing to do on its response
	// headers (SkipResponseHeaders).
	skipResponse bool
}

// SetVMContext registers the plugin. Call it from an init function of the
// plugin's main package: a c-shared module runs package initializers from
// _initialize, and main is never called.
func SetVMContext(ctx VMContext) { vmContext = ctx }

func onContextCreate(contextID, parentID uint32) {
	if parentID == 0 {
		if vmContext == nil {
			vmContext = DefaultVMContext{}
		}
		roots.Put(contextID, vmContext.NewPluginContext(contextID))
		return
	}
	root := roots.Ref(parentID)
	if root == nil {
		return // the host broke the ABI; later callbacks for contextID are ignored
	}
	streams.Put(contextID, stream{HTTPContext: (*root).NewHTTPContext(contextID), root: parentID})
}

func onVMStart(vmConfigSize uint32) bool {
	if vmContext == nil {
		vmContext = DefaultVMContext{}
	}
	return vmContext.OnVMStart(int(vmConfigSize))
}

func onConfigure(rootID, configSize uint32) bool {
	root := roots.Ref(rootID)
	return root != nil && (*root).OnPluginStart(int(configSize))
}

func onTick(rootID uint32) {
	if root := roots.Ref(rootID); root != nil {
		(*root).OnTick()
	}
}

func onHTTPCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	if root := roots.Ref(rootID); root != nil {
		(*root).OnHTTPCallResponse(calloutID, int(numHeaders), int(bodySize), int(numTrailers))
	}
}

func onRequestHeaders(contextID, numHeaders uint32, endOfStream bool) Action {
	if s := streams.Ref(contextID); s != nil {
		return s.OnRequestHeaders(int(numHeaders), endOfStream)
	}
	return Continue
}

// SkipResponseHeaders tells the binding that HTTP context contextID has
// nothing to do on its response: proxy_on_response_headers and
// proxy_on_response_body then answer Continue for it without entering it.
// Every response passes the filter, a reply it sent itself included, and
// entering a context costs a callback's whole overhead (a recovery frame,
// the context's look-up, its method) for nothing when, say, the filter
// answered the request or let it through with no header to add; a body
// comes in as many callbacks as it has parts.
func SkipResponseHeaders(contextID uint32) {
	if s := streams.Ref(contextID); s != nil {
		s.skipResponse = true
	}
}

// responseStream is the stream to call on contextID's response headers:
// nil when there is no such context or it skips them.
func responseStream(contextID uint32) *stream {
	if s := streams.Ref(contextID); s != nil && !s.skipResponse {
		return s
	}
	return nil
}

func onRequestBody(contextID, size uint32, endOfStream bool) Action {
	s, _ := streams.Get(contextID)
	if h, ok := s.HTTPContext.(RequestBodyHandler); ok {
		return h.OnRequestBody(int(size), endOfStream)
	}
	return Continue
}

func onRequestTrailers(contextID, n uint32) Action {
	s, _ := streams.Get(contextID)
	if h, ok := s.HTTPContext.(RequestTrailersHandler); ok {
		return h.OnRequestTrailers(int(n))
	}
	return Continue
}

func onResponseBody(contextID, size uint32, endOfStream bool) Action {
	s, _ := streams.Get(contextID)
	if h, ok := s.HTTPContext.(ResponseBodyHandler); ok {
		return h.OnResponseBody(int(size), endOfStream)
	}
	return Continue
}

func onResponseTrailers(contextID, n uint32) Action {
	s, _ := streams.Get(contextID)
	if h, ok := s.HTTPContext.(ResponseTrailersHandler); ok {
		return h.OnResponseTrailers(int(n))
	}
	return Continue
}

func onLog(contextID uint32) {
	if s := streams.Ref(contextID); s != nil {
		s.OnLog()
	}
}

// onDone reports whether the host may delete the context now. Stream
// contexts always may; a root context asks the plugin.
func onDone(contextID uint32) bool {
	if root := roots.Ref(contextID); root != nil {
		return (*root).OnPluginDone()
	}
	return true
}

func onDelete(contextID uint32) {
	if p := streams.Ref(contextID); p != nil {
		s := *p
		streams.Delete(contextID)
		s.OnDone()
		return
	}
	roots.Delete(contextID)
}

// recovered handles a panic that escaped callback on contextID: the value
// and the stack go to the host's log at critical level, and the root
// context, when it is a PanicHandler, answers for it. It returns the action
// for a header callback (Continue when no root answers).
func recovered(callback string, contextID uint32, v any) (a Action) {
	a = Continue
	var stack [8 << 10]byte
	n := runtime.Stack(stack[:], false)
	msg := make([]byte, 0, 64+n)
	msg = append(msg, "panic in "...)
	msg = append(msg, callback...)
	msg = append(msg, ": "...)
	msg = append(msg, panicText(v)...)
	msg = append(msg, '\n')
	msg = append(msg, stack[:n]...)
	_ = Log(LogLevelCritical, string(msg))
	rootID := contextID
	s, _ := streams.Get(contextID)
	if s.HTTPContext != nil {
		rootID = s.root
	}
	r, _ := roots.Get(rootID)
	h, ok := r.(PanicHandler)
	if !ok {
		return a
	}
	defer func() {
		if v := recover(); v != nil {
			_ = Log(LogLevelCritical, "panic in OnPanic: "+panicText(v))
		}
	}()
	return h.OnPanic(contextID, s.HTTPContext, v)
}

// panicText describes a panic value without fmt (which the plugin does not
// link).
func panicText(v any) string {
	switch x := v.(type) {
	case error:
		return x.Error()
	case string:
		return x
	case interface{ String() string }:
		return x.String()
	}
	return "a value of a type without a text form"
}
