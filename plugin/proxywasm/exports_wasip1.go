//go:build wasip1

package proxywasm

import "unsafe"

// Exported callbacks of ABI v0.2.1. Each brackets its work with enter/leave
// so that host memory handed out during the callback is reclaimed when the
// outermost callback returns, and recovers a panic (see PanicHandler)
// instead of letting it trap the VM. Booleans travel as uint32 (i32).
//
// proxy_on_log, proxy_on_done, proxy_on_request_body and the two
// trailers callbacks are not exported here. A host calls none of them when
// the module lacks it (proxy-wasm-cpp-host src/context.cc:
// ContextBase::onLog skips a missing on_log_, ContextBase::onDone returns
// true without on_done_, and onRequestBody, onRequestTrailers and
// onResponseTrailers continue without entering the module), and entering
// the module costs on every request, or on every chunk of a request body
// (a few hundred nanoseconds each on wazero): a plugin that does nothing
// in them, as Sluice's, is cheaper without them. A plugin that needs one
// exports it itself, with ProxyOnLog, ProxyOnDone, ProxyOnRequestBody,
// ProxyOnRequestTrailers or ProxyOnResponseTrailers as its body.

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer { return allocate(size) }

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentID uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_context_create", contextID, v)
		}
		leave()
	}()
	onContextCreate(contextID, parentID)
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, vmConfigSize uint32) (ok uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_vm_start", rootID, v)
			ok = 0
		}
		leave()
	}()
	return b2u(onVMStart(vmConfigSize))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, configSize uint32) (ok uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_configure", rootID, v)
			ok = 0 // a configuration that makes the plugin panic is refused
		}
		leave()
	}()
	return b2u(onConfigure(rootID, configSize))
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_tick", rootID, v)
		}
		leave()
	}()
	onTick(rootID)
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_http_call_response", rootID, v)
		}
		leave()
	}()
	onHTTPCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) (a uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_request_headers", contextID, v))
		}
		leave()
	}()
	return uint32(onRequestHeaders(contextID, numHeaders, endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) (a uint32) {
	s := responseStream(contextID)
	if s == nil {
		return uint32(Continue)
	}
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_response_headers", contextID, v))
		}
		leave()
	}()
	return uint32(s.OnResponseHeaders(int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) (a uint32) {
	if responseStream(contextID) == nil {
		return uint32(Continue)
	}
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_response_body", contextID, v))
		}
		leave()
	}()
	return uint32(onResponseBody(contextID, bodySize, endOfStream != 0))
}

// ProxyOnRequestBody is the body of a proxy_on_request_body export, for a
// plugin whose streams read request bodies (RequestBodyHandler):
//
//	//go:wasmexport proxy_on_request_body
//	func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
//		return proxywasm.ProxyOnRequestBody(contextID, bodySize, endOfStream)
//	}
func ProxyOnRequestBody(contextID, bodySize, endOfStream uint32) (a uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_request_body", contextID, v))
		}
		leave()
	}()
	return uint32(onRequestBody(contextID, bodySize, endOfStream != 0))
}

// ProxyOnRequestTrailers is the body of a proxy_on_request_trailers
// export, for a plugin whose streams read them (RequestTrailersHandler).
func ProxyOnRequestTrailers(contextID, numTrailers uint32) (a uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_request_trailers", contextID, v))
		}
		leave()
	}()
	return uint32(onRequestTrailers(contextID, numTrailers))
}

// ProxyOnResponseTrailers is the body of a proxy_on_response_trailers
// export, for a plugin whose streams read them (ResponseTrailersHandler).
func ProxyOnResponseTrailers(contextID, numTrailers uint32) (a uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			a = uint32(recovered("proxy_on_response_trailers", contextID, v))
		}
		leave()
	}()
	return uint32(onResponseTrailers(contextID, numTrailers))
}

// ProxyOnLog is the body of a proxy_on_log export, for a plugin that
// needs one:
//
//	//go:wasmexport proxy_on_log
//	func proxyOnLog(contextID uint32) { proxywasm.ProxyOnLog(contextID) }
func ProxyOnLog(contextID uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_log", contextID, v)
		}
		leave()
	}()
	onLog(contextID)
}

// ProxyOnDone is the body of a proxy_on_done export, for a plugin that
// needs one (a root context that is not done at once):
//
//	//go:wasmexport proxy_on_done
//	func proxyOnDone(contextID uint32) uint32 { return proxywasm.ProxyOnDone(contextID) }
func ProxyOnDone(contextID uint32) (ok uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_done", contextID, v)
			ok = 1
		}
		leave()
	}()
	return b2u(onDone(contextID))
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) {
	enter()
	defer func() {
		if v := recover(); v != nil {
			recovered("proxy_on_delete", contextID, v)
		}
		leave()
	}()
	onDelete(contextID)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
