// Package proxywasm is the guest side of the proxy-wasm ABI v0.2.1 for
// plugins built with upstream Go (GOOS=wasip1 GOARCH=wasm
// -buildmode=c-shared).
//
// It exists because tetratelabs/proxy-wasm-go-sdk builds only with TinyGo,
// which our build machines cannot install, and its successor for Go 1.24's
// //go:wasmexport is not in the module registry. This package is a small
// binding written from the specification
// (https://github.com/proxy-wasm/spec/tree/main/abi-versions/v0.2.1): the
// exported callbacks dispatch to the contexts a plugin registers with
// SetVMContext, and the package functions wrap the host calls.
//
// # Lifetimes (read this)
//
// Memory the host hands to the plugin during a callback (header values,
// properties, shared data, call-out bodies) is carved from a per-callback
// arena that is reset when the top-level exported callback returns. Every
// []byte returned by a function of this package whose documentation says
// "view" is valid ONLY until the current callback returns. Copy it (or
// convert it to a string) to keep it. Functions returning string copy.
//
// The arena makes the steady-state request path allocation-free: the host's
// proxy_on_memory_allocate calls are served from it, header maps are
// serialized into a reusable buffer, and names are passed to the host as
// pointer and length of the Go string without copying.
//
// # Threading
//
// A proxy-wasm VM is single-threaded; callbacks never overlap except that
// the host may call proxy_on_memory_allocate from inside a host call. The
// package keeps its state in package variables for that reason and must not
// be used from goroutines.
//
// # Building natively
//
// Types, interfaces and the package functions build on every platform so
// that filters compile and unit-test natively; outside wasip1 every host
// call returns ErrUnimplemented.
package proxywasm
