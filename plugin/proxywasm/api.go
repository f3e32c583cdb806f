package proxywasm

import (
	"io"
	"unsafe"
)

// Return slots for host calls. The host writes a 32-bit address into the low
// half of retData (a 64-bit Go pointer on wasm; the high half stays zero) and
// sizes into the uint32 slots. They are package variables so that taking
// their address never makes a heap allocation; the VM is single-threaded.
var (
	retData *byte
	retSize uint32
	retU32  uint32
	retU64  uint64
	retI64  int64
)

// scratch holds serialized header maps and property paths on their way to
// the host. The host copies them during the call, so it is reused.
var scratch []byte

func strPtr(s string) unsafe.Pointer { return unsafe.Pointer(unsafe.StringData(s)) }

func bytesPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// view returns the block the host just returned through retData/retSize.
func view() []byte {
	if retData == nil || retSize == 0 {
		return nil
	}
	return unsafe.Slice(retData, retSize)
}

func resetRet() { retData, retSize = nil, 0 }

// Log writes msg to the host log at level.
func Log(level LogLevel, msg string) error {
	return Status(proxyLog(uint32(level), strPtr(msg), uint32(len(msg)))).Err()
}

// GetLogLevel returns the host's current log level: messages below it are
// dropped, so a plugin can skip formatting them.
func GetLogLevel() (LogLevel, error) {
	retU32 = 0
	if err := Status(proxyGetLogLevel(unsafe.Pointer(&retU32))).Err(); err != nil {
		return LogLevelInfo, err
	}
	return LogLevel(retU32), nil
}

// LogInfo and friends are shorthands for Log.
func LogDebug(msg string) { _ = Log(LogLevelDebug, msg) }
func LogInfo(msg string)  { _ = Log(LogLevelInfo, msg) }
func LogWarn(msg string)  { _ = Log(LogLevelWarn, msg) }
func LogError(msg string) { _ = Log(LogLevelError, msg) }

// getBuffer returns a view of a whole host buffer.
func getBuffer(bufferType uint32) ([]byte, error) {
	retU32 = 0
	if err := Status(proxyGetBufferStatus(bufferType, unsafe.Pointer(&retSize), unsafe.Pointer(&retU32))).Err(); err != nil {
		return nil, err
	}
	return getBufferPrefix(bufferType, retSize)
}

// getBufferPrefix returns a view of the first size bytes of a host buffer.
func getBufferPrefix(bufferType, size uint32) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	resetRet()
	if err := Status(proxyGetBufferBytes(bufferType, 0, size, unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err(); err != nil {
		return nil, err
	}
	return view(), nil
}

// GetPluginConfiguration returns a copy of the plugin configuration. Valid in
// OnPluginStart.
func GetPluginConfiguration() ([]byte, error) {
	b, err := getBuffer(bufferPluginConfiguration)
	return clone(b), err
}

// GetVMConfiguration returns a copy of the VM configuration. Valid in OnVMStart.
func GetVMConfiguration() ([]byte, error) {
	b, err := getBuffer(bufferVMConfiguration)
	return clone(b), err
}

// GetHTTPCallResponseBody returns a view of the call-out response body,
// whose size OnHTTPCallResponse was given: the host is not asked for it
// again. Valid in OnHTTPCallResponse, and only until it returns.
func GetHTTPCallResponseBody(size int) ([]byte, error) {
	return getBufferPrefix(bufferHTTPCallResponseBody, uint32(size))
}

// bodyPart bounds the parts VisitHTTPResponseBody reads a body in, so
// that each fits the arena.
const bodyPart = 16 << 10

// VisitHTTPResponseBody writes the first size bytes of the response body of
// the current callback (its proxy_on_response_body's body_buffer_length) to
// w, in parts of at most 16 KiB. Each part is valid during its Write only:
// the memory the host copied it into is reclaimed before the next, so a
// large body costs no more guest memory than a small one.
func VisitHTTPResponseBody(size int, w io.Writer) error {
	for off := 0; off < size; {
		mark, overflow := arena.off, len(arena.overflow)
		resetRet()
		err := Status(proxyGetBufferBytes(bufferHTTPResponseBody, uint32(off), uint32(min(size-off, bodyPart)),
			unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err()
		b := view()
		if err == nil && len(b) > 0 {
			_, _ = w.Write(b)
		}
		arena.off = mark
		clear(arena.overflow[overflow:])
		arena.overflow = arena.overflow[:overflow]
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return nil // the host has no more
		}
		off += len(b)
	}
	return nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

func getHeaderBytes(mapType uint32, name string) ([]byte, error) {
	resetRet()
	st := proxyGetHeaderMapValue(mapType, strPtr(name), uint32(len(name)), unsafe.Pointer(&retData), unsafe.Pointer(&retSize))
	if err := Status(st).Err(); err != nil {
		return nil, err
	}
	return view(), nil
}

func getHeader(mapType uint32, name string) (string, error) {
	b, err := getHeaderBytes(mapType, name)
	return string(b), err
}

func getHeaderPairs(mapType uint32) ([][2]string, error) {
	resetRet()
	if err := Status(proxyGetHeaderMapPairs(mapType, unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err(); err != nil {
		return nil, err
	}
	return ParseHeaderMap(view())
}

func visitHeaders(mapType uint32, fn func(name, value []byte)) error {
	resetRet()
	if err := Status(proxyGetHeaderMapPairs(mapType, unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err(); err != nil {
		return err
	}
	return VisitHeaderMap(view(), fn)
}

func setHeader(mapType uint32, name, value string) error {
	return Status(proxyReplaceHeaderMapValue(mapType, strPtr(name), uint32(len(name)), strPtr(value), uint32(len(value)))).Err()
}

func setHeaderBytes(mapType uint32, name string, value []byte) error {
	return Status(proxyReplaceHeaderMapValue(mapType, strPtr(name), uint32(len(name)), bytesPtr(value), uint32(len(value)))).Err()
}

func addHeader(mapType uint32, name, value string) error {
	return Status(proxyAddHeaderMapValue(mapType, strPtr(name), uint32(len(name)), strPtr(value), uint32(len(value)))).Err()
}

func addHeaderBytes(mapType uint32, name string, value []byte) error {
	return Status(proxyAddHeaderMapValue(mapType, strPtr(name), uint32(len(name)), bytesPtr(value), uint32(len(value)))).Err()
}

func removeHeader(mapType uint32, name string) error {
	return Status(proxyRemoveHeaderMapValue(mapType, strPtr(name), uint32(len(name)))).Err()
}

// Request headers. Names are lower-case; pseudo headers (":path",
// ":method", ":authority", ":scheme") are part of the map. Valid in
// OnRequestHeaders (or while the request is paused) and OnLog.

// GetRequestHeaderBytes returns a view of the first value of name, or
// ErrNotFound. The view is valid only until the callback returns.
func GetRequestHeaderBytes(name string) ([]byte, error) {
	return getHeaderBytes(mapRequestHeaders, name)
}

// GetRequestHeader returns a copy of the first value of name, or ErrNotFound.
func GetRequestHeader(name string) (string, error) { return getHeader(mapRequestHeaders, name) }

// GetRequestHeaders returns a copy of every request header in order.
func GetRequestHeaders() ([][2]string, error) { return getHeaderPairs(mapRequestHeaders) }

// GetRequestHeaderMapView makes v the request headers, fetched with one
// host call, for a plugin that looks up several: valid during the current
// callback.
func GetRequestHeaderMapView(v *HeaderMapView) error {
	resetRet()
	if err := Status(proxyGetHeaderMapPairs(mapRequestHeaders, unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err(); err != nil {
		v.Reset(nil)
		return err
	}
	return v.Reset(view())
}

// VisitRequestHeaders calls fn with views of every request header in order,
// without allocating. The views are valid only until the callback returns.
func VisitRequestHeaders(fn func(name, value []byte)) error {
	return visitHeaders(mapRequestHeaders, fn)
}

// SetRequestHeader replaces every value of name with value (adds it when absent).
func SetRequestHeader(name, value string) error { return setHeader(mapRequestHeaders, name, value) }

// SetRequestHeaderBytes is SetRequestHeader for a byte-slice value.
func SetRequestHeaderBytes(name string, value []byte) error {
	return setHeaderBytes(mapRequestHeaders, name, value)
}

// AddRequestHeader appends a value of name.
func AddRequestHeader(name, value string) error { return addHeader(mapRequestHeaders, name, value) }

// RemoveRequestHeader removes every value of name; absent names are not an error.
func RemoveRequestHeader(name string) error { return removeHeader(mapRequestHeaders, name) }

// Response headers, valid in OnResponseHeaders (or while the response is
// paused) and OnLog. ":status" is part of the map.

// GetResponseHeaderBytes returns a view of the first value of name.
func GetResponseHeaderBytes(name string) ([]byte, error) {
	return getHeaderBytes(mapResponseHeaders, name)
}

// GetResponseHeader returns a copy of the first value of name.
func GetResponseHeader(name string) (string, error) { return getHeader(mapResponseHeaders, name) }

// GetResponseHeaders returns a copy of every response header in order.
func GetResponseHeaders() ([][2]string, error) { return getHeaderPairs(mapResponseHeaders) }

// SetResponseHeader replaces every value of name with value.
func SetResponseHeader(name, value string) error { return setHeader(mapResponseHeaders, name, value) }

// AddResponseHeader appends a value of name.
func AddResponseHeader(name, value string) error { return addHeader(mapResponseHeaders, name, value) }

// AddResponseHeaderBytes is AddResponseHeader for a byte-slice value.
func AddResponseHeaderBytes(name string, value []byte) error {
	return addHeaderBytes(mapResponseHeaders, name, value)
}

// RemoveResponseHeader removes every value of name.
func RemoveResponseHeader(name string) error { return removeHeader(mapResponseHeaders, name) }

// Call-out response headers, valid in OnHTTPCallResponse. ":status" carries
// the upstream status.

// GetHTTPCallResponseHeaderBytes returns a view of the first value of name.
func GetHTTPCallResponseHeaderBytes(name string) ([]byte, error) {
	return getHeaderBytes(mapHTTPCallRespHeaders, name)
}

// GetHTTPCallResponseHeaders returns a copy of every call-out response header.
func GetHTTPCallResponseHeaders() ([][2]string, error) { return getHeaderPairs(mapHTTPCallRespHeaders) }

// GetProperty returns a view of the property at path, e.g.
// GetProperty("source", "address"). Strings come back as raw bytes, integers
// as 8 little-endian bytes (see PropertyInt64). The view is valid only until
// the callback returns.
func GetProperty(path ...string) ([]byte, error) {
	s := scratch[:0]
	for i, p := range path {
		if i > 0 {
			s = append(s, 0)
		}
		s = append(s, p...)
	}
	scratch = s
	resetRet()
	if err := Status(proxyGetProperty(bytesPtr(s), uint32(len(s)), unsafe.Pointer(&retData), unsafe.Pointer(&retSize))).Err(); err != nil {
		return nil, err
	}
	return view(), nil
}

// PropertyInt64 decodes an integer property (8 bytes, little-endian).
func PropertyInt64(b []byte) (int64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return int64(v), true
}

// SendLocalResponse answers the current stream with status, body and
// headers instead of forwarding it. headers is a serialized map
// (AppendHeaderMap), so that a plugin answering many requests alike
// serializes it once. details is Envoy's response code detail
// (lower_snake_case, no spaces).
func SendLocalResponse(status uint32, details string, body []byte, headers []byte) error {
	return Status(proxySendLocalResponse(status, strPtr(details), uint32(len(details)),
		bytesPtr(body), uint32(len(body)), bytesPtr(headers), uint32(len(headers)), -1)).Err()
}

// ResumeHTTPRequest continues a request paused in OnRequestHeaders.
func ResumeHTTPRequest() error { return Status(proxyContinueStream(streamHTTPRequest)).Err() }

// ResumeHTTPResponse continues a response paused in OnResponseHeaders.
func ResumeHTTPResponse() error { return Status(proxyContinueStream(streamHTTPResponse)).Err() }

// DispatchHTTPCall sends an HTTP request to the upstream cluster. headers
// must carry ":method", ":path" and ":authority". The answer arrives in
// PluginContext.OnHTTPCallResponse of the root context, with calloutID.
func DispatchHTTPCall(cluster string, headers [][2]string, body []byte, trailers [][2]string, timeoutMS uint32) (uint32, error) {
	s := AppendHeaderMap(scratch[:0], headers)
	hdrLen := len(s)
	s = AppendHeaderMap(s, trailers)
	scratch = s
	var hp, tp unsafe.Pointer
	if hdrLen > 0 {
		hp = unsafe.Pointer(&s[0])
	}
	if len(s) > hdrLen {
		tp = unsafe.Pointer(&s[hdrLen])
	}
	retU32 = 0
	st := proxyHTTPCall(strPtr(cluster), uint32(len(cluster)), hp, uint32(hdrLen),
		bytesPtr(body), uint32(len(body)), tp, uint32(len(s)-hdrLen), timeoutMS, unsafe.Pointer(&retU32))
	if err := Status(st).Err(); err != nil {
		return 0, err
	}
	return retU32, nil
}

// SetEffectiveContext makes later host calls act on contextID, e.g. the HTTP
// stream a call-out answer belongs to.
func SetEffectiveContext(contextID uint32) error {
	return Status(proxySetEffectiveContext(contextID)).Err()
}

// GetSharedData returns a view of the value shared by all VMs under key and
// its CAS token. ErrNotFound when absent.
func GetSharedData(key string) ([]byte, uint32, error) {
	resetRet()
	retU32 = 0
	st := proxyGetSharedData(strPtr(key), uint32(len(key)), unsafe.Pointer(&retData), unsafe.Pointer(&retSize), unsafe.Pointer(&retU32))
	if err := Status(st).Err(); err != nil {
		return nil, 0, err
	}
	return view(), retU32, nil
}

// SetSharedData stores value under key. A non-zero cas must match the
// current token (from GetSharedData), else ErrCASMismatch.
func SetSharedData(key string, value []byte, cas uint32) error {
	return Status(proxySetSharedData(strPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value)), cas)).Err()
}

// DefineMetric defines (or finds) the metric name and returns its id.
func DefineMetric(t MetricType, name string) (uint32, error) {
	retU32 = 0
	if err := Status(proxyDefineMetric(uint32(t), strPtr(name), uint32(len(name)), unsafe.Pointer(&retU32))).Err(); err != nil {
		return 0, err
	}
	return retU32, nil
}

// IncrementMetric adds delta to a counter or gauge (counters reject negatives).
func IncrementMetric(id uint32, delta int64) error {
	return Status(proxyIncrementMetric(id, delta)).Err()
}

// RecordMetric sets a gauge or records a histogram sample.
func RecordMetric(id uint32, value uint64) error { return Status(proxyRecordMetric(id, value)).Err() }

// GetMetric returns the value of a counter or gauge.
func GetMetric(id uint32) (uint64, error) {
	retU64 = 0
	if err := Status(proxyGetMetric(id, unsafe.Pointer(&retU64))).Err(); err != nil {
		return 0, err
	}
	return retU64, nil
}

// SetTickPeriod asks for OnTick on the current root context every ms
// milliseconds; 0 stops the timer. Call it from a root context callback.
func SetTickPeriod(ms uint32) error { return Status(proxySetTickPeriodMilliseconds(ms)).Err() }

// GetCurrentTimeNanos returns the host's wall clock in Unix nanoseconds;
// the time means nothing when the error is not nil. It is read on every
// request a limit applies to, and is small enough to be inlined.
func GetCurrentTimeNanos() (int64, error) {
	st := proxyGetCurrentTimeNanoseconds(unsafe.Pointer(&retI64))
	return retI64, Status(st).Err()
}

// Done tells the host that the current context, which returned false from
// OnPluginDone, may now be deleted.
func Done() error { return Status(proxyDone()).Err() }
