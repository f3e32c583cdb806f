//go:build wasip1

package proxywasm

import "unsafe"

// Exported callbacks of ABI v0.2.1. Each brackets its work with enter/leave
// so that host memory handed out during the callback is reclaimed when the
// outermost callback returns. Booleans travel as uint32 (i32).

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer { return allocate(size) }

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentID uint32) {
	enter()
	onContextCreate(contextID, parentID)
	leave()
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(_, vmConfigSize uint32) uint32 {
	enter()
	ok := onVMStart(vmConfigSize)
	leave()
	return b2u(ok)
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, configSize uint32) uint32 {
	enter()
	ok := onConfigure(rootID, configSize)
	leave()
	return b2u(ok)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	enter()
	onTick(rootID)
	leave()
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	enter()
	onHTTPCallResponse(rootID, calloutID, numHeaders, bodySize, numTrailers)
	leave()
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	enter()
	a := onRequestHeaders(contextID, numHeaders, endOfStream != 0)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	enter()
	a := onRequestBody(contextID, bodySize, endOfStream != 0)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	enter()
	a := onRequestTrailers(contextID, numTrailers)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	enter()
	a := onResponseHeaders(contextID, numHeaders, endOfStream != 0)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	enter()
	a := onResponseBody(contextID, bodySize, endOfStream != 0)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	enter()
	a := onResponseTrailers(contextID, numTrailers)
	leave()
	return uint32(a)
}

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) {
	enter()
	onLog(contextID)
	leave()
}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) uint32 {
	enter()
	ok := onDone(contextID)
	leave()
	return b2u(ok)
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) {
	enter()
	onDelete(contextID)
	leave()
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
