//go:build wasip1

package main

import (
	"strconv"
	"syscall"
	"unsafe"

	"github.com/sluicehq/sluice/plugin/proxywasm"
)

// Host calls made directly, bypassing the binding, to observe the host's
// exact answers (statuses, errnos) and its restrictions.

//go:wasmimport env proxy_get_header_map_size
func rawHeaderMapSize(mapType uint32, ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_buffer_status
func rawBufferStatus(bufferType uint32, retSize unsafe.Pointer, retFlags unsafe.Pointer) uint32

// callResponseBodySize is the size of the call-out response body as
// proxy_get_buffer_status gives it, which the binding does not ask for.
func callResponseBodySize() (int, bool) {
	const httpCallResponseBody = 4 // proxy-wasm's BufferType
	var size, flags uint32
	ok := rawBufferStatus(httpCallResponseBody, unsafe.Pointer(&size), unsafe.Pointer(&flags)) == 0
	return int(size), ok
}

//go:wasmimport env proxy_get_status
func rawGetStatus(code unsafe.Pointer, retData unsafe.Pointer, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_continue_stream
func rawContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_get_log_level
func rawGetLogLevel(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_property
func rawGetProperty(path unsafe.Pointer, pathSize uint32, retData unsafe.Pointer, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_send_local_response
func rawSendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport wasi_snapshot_preview1 fd_read
func wasiFdRead(fd int32, iovs unsafe.Pointer, n int32, nread unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_write
func wasiFdWrite(fd int32, iovs unsafe.Pointer, n int32, nwritten unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 poll_oneoff
func wasiPollOneoff(in unsafe.Pointer, out unsafe.Pointer, n int32, nevents unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 path_open
func wasiPathOpen(fd int32, dirflags int32, path unsafe.Pointer, pathLen int32, oflags int32, rightsBase int64, rightsInheriting int64, fdflags int32, fdOut unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_prestat_get
func wasiFdPrestatGet(fd int32, buf unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_prestat_dir_name
func wasiFdPrestatDirName(fd int32, path unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_fdstat_get
func wasiFdFdstatGet(fd int32, buf unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_fdstat_set_flags
func wasiFdFdstatSetFlags(fd int32, flags int32) int32

//go:wasmimport wasi_snapshot_preview1 clock_time_get
func wasiClockTimeGet(id int32, precision int64, t unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 random_get
func wasiRandomGet(buf unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 sched_yield
func wasiSchedYield() int32

//go:wasmimport wasi_snapshot_preview1 args_sizes_get
func wasiArgsSizesGet(argc unsafe.Pointer, size unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 environ_sizes_get
func wasiEnvironSizesGet(count unsafe.Pointer, size unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 proc_exit
func wasiProcExit(code int32)

// The host allocates guest memory through malloc, which cpp-host prefers to
// proxy_on_memory_allocate. This one hands out slices of a ring, so the hot
// path stays allocation-free, and can make a host call that cpp-host does
// not allow during an allocation.
var (
	ring          [1 << 20]byte
	ringOff       int
	big           []byte
	restrictAlloc bool
)

//go:wasmexport malloc
func malloc(size uint32) unsafe.Pointer {
	if restrictAlloc {
		var l uint32
		rawGetLogLevel(unsafe.Pointer(&l))
	}
	n := (int(size) + 8) &^ 7
	if n > len(ring) {
		big = make([]byte, n)
		return unsafe.Pointer(&big[0])
	}
	if ringOff+n > len(ring) {
		ringOff = 0
	}
	p := unsafe.Pointer(&ring[ringOff])
	ringOff += n
	return p
}

// initHostCall: with TESTGUEST_INIT_CALL=1 in the VM's environment, the
// start function makes a host call cpp-host does not allow there.
func initHostCall() {
	if v, _ := syscall.Getenv("TESTGUEST_INIT_CALL"); v == "1" {
		var l uint32
		rawGetLogLevel(unsafe.Pointer(&l))
	}
	if v, _ := syscall.Getenv("TESTGUEST_INIT_LOG"); v != "" {
		proxywasm.LogInfo("init: " + v) // allowed at start
	}
}

// wasiProbe answers x-wasi-* headers with each WASI call's errno.
func wasiProbe() {
	set := func(k string, v int32) { _ = proxywasm.SetRequestHeader("x-wasi-"+k, strconv.Itoa(int(v))) }
	var buf [64]byte
	var n uint32
	var iov [2]uint32
	set("fd_read", wasiFdRead(0, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n)))
	set("poll_oneoff", wasiPollOneoff(unsafe.Pointer(&buf), unsafe.Pointer(&buf), 1, unsafe.Pointer(&n)))
	path := []byte("/etc/passwd")
	set("path_open", wasiPathOpen(3, 0, unsafe.Pointer(&path[0]), int32(len(path)), 0, 0, 0, 0, unsafe.Pointer(&n)))
	set("fd_prestat_get", wasiFdPrestatGet(3, unsafe.Pointer(&buf)))
	set("fd_prestat_dir_name", wasiFdPrestatDirName(3, unsafe.Pointer(&buf), 8))
	set("fd_fdstat_set_flags", wasiFdFdstatSetFlags(1, 0))
	set("fd_fdstat_get_1", wasiFdFdstatGet(1, unsafe.Pointer(&buf)))
	_ = proxywasm.SetRequestHeader("x-wasi-fdstat-rights", strconv.Itoa(int(buf[8])))
	set("fd_fdstat_get_3", wasiFdFdstatGet(3, unsafe.Pointer(&buf)))
	var t uint64
	set("clock_realtime", wasiClockTimeGet(0, 0, unsafe.Pointer(&t)))
	_ = proxywasm.SetRequestHeader("x-wasi-realtime", strconv.FormatUint(t, 10))
	set("clock_monotonic", wasiClockTimeGet(1, 0, unsafe.Pointer(&t)))
	set("clock_cputime", wasiClockTimeGet(2, 0, unsafe.Pointer(&t)))
	set("random_get_max", wasiRandomGet(unsafe.Pointer(&big0[0]), int32(len(big0))))
	set("random_get_over", wasiRandomGet(unsafe.Pointer(&big0[0]), int32(len(big0)+1)))
	set("sched_yield", wasiSchedYield())
	var argc, argSize uint32
	set("args_sizes_get", wasiArgsSizesGet(unsafe.Pointer(&argc), unsafe.Pointer(&argSize)))
	_ = proxywasm.SetRequestHeader("x-wasi-argc", strconv.Itoa(int(argc)))
	var envc, envSize uint32
	set("environ_sizes_get", wasiEnvironSizesGet(unsafe.Pointer(&envc), unsafe.Pointer(&envSize)))
	_ = proxywasm.SetRequestHeader("x-wasi-environ", strconv.Itoa(int(envc))+"/"+strconv.Itoa(int(envSize)))
	msg := []byte("to stdout\n")
	iov = [2]uint32{uint32(uintptr(unsafe.Pointer(&msg[0]))), uint32(len(msg))}
	set("fd_write_1", wasiFdWrite(1, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n)))
	_ = proxywasm.SetRequestHeader("x-wasi-written", strconv.Itoa(int(n)))
	set("fd_write_3", wasiFdWrite(3, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n)))
}

var big0 [64 << 10]byte

// rawProbe answers x-raw-* headers with proxy-wasm statuses the binding
// would hide.
func rawProbe() {
	set := func(k string, v uint32) { _ = proxywasm.SetRequestHeader("x-raw-"+k, strconv.Itoa(int(v))) }
	var size uint32
	set("map_size", rawHeaderMapSize(0, unsafe.Pointer(&size)))
	_ = proxywasm.SetRequestHeader("x-raw-map-bytes", strconv.Itoa(int(size)))
	set("resp_map_size", rawHeaderMapSize(2, unsafe.Pointer(&size)))
	set("continue_downstream", rawContinueStream(2))
	set("continue_upstream", rawContinueStream(3))
	set("continue_bad", rawContinueStream(4))
	var code uint32
	var p unsafe.Pointer
	var n uint32
	set("status", rawGetStatus(unsafe.Pointer(&code), unsafe.Pointer(&p), unsafe.Pointer(&n)))
	_ = proxywasm.SetRequestHeader("x-raw-status-code", strconv.Itoa(int(code)))
	dotted := []byte("source.address")
	set("property_dotted", rawGetProperty(unsafe.Pointer(&dotted[0]), uint32(len(dotted)), unsafe.Pointer(&p), unsafe.Pointer(&n)))
}

// trap makes the VM trap for real: a store far beyond linear memory (Go
// does not bounds-check raw pointers, and a panic would be recovered by the
// binding).
func trap() {
	*(*byte)(unsafe.Add(unsafe.Pointer(&ring[0]), 3<<30)) = 1
}

// calloutStatus is proxy_get_status as "code message".
func calloutStatus() string {
	var code uint32
	var p *byte
	var n uint32
	if st := rawGetStatus(unsafe.Pointer(&code), unsafe.Pointer(&p), unsafe.Pointer(&n)); st != 0 {
		return "status " + strconv.Itoa(int(st))
	}
	msg := ""
	if n > 0 {
		msg = unsafe.String(p, n)
	}
	return strconv.Itoa(int(code)) + " " + msg
}
