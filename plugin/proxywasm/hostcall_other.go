//go:build !wasip1

package proxywasm

import "unsafe"

// Native stand-ins for the host calls so that filters compile and unit-test
// outside wasm. Every call reports StatusUnimplemented.

func proxyLog(level uint32, msg unsafe.Pointer, msgSize uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetBufferBytes(bufferType uint32, start uint32, maxSize uint32, retData unsafe.Pointer, retSize unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetBufferStatus(bufferType uint32, retSize unsafe.Pointer, retFlags unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetHeaderMapPairs(mapType uint32, retData unsafe.Pointer, retSize unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, retData unsafe.Pointer, retSize unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyRemoveHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyGetProperty(path unsafe.Pointer, pathSize uint32, retData unsafe.Pointer, retSize unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxySendLocalResponse(statusCode uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyContinueStream(streamType uint32) uint32 { return uint32(StatusUnimplemented) }

func proxyHTTPCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeoutMS uint32, retCallID unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxySetEffectiveContext(contextID uint32) uint32 { return uint32(StatusUnimplemented) }

func proxyGetSharedData(key unsafe.Pointer, keySize uint32, retData unsafe.Pointer, retSize unsafe.Pointer, retCAS unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyIncrementMetric(metricID uint32, delta int64) uint32 { return uint32(StatusUnimplemented) }

func proxyRecordMetric(metricID uint32, value uint64) uint32 { return uint32(StatusUnimplemented) }

func proxyGetMetric(metricID uint32, retValue unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxySetTickPeriodMilliseconds(periodMS uint32) uint32 { return uint32(StatusUnimplemented) }

func proxyGetLogLevel(retLevel unsafe.Pointer) uint32 { return uint32(StatusUnimplemented) }

func proxyGetCurrentTimeNanoseconds(retTime unsafe.Pointer) uint32 {
	return uint32(StatusUnimplemented)
}

func proxyDone() uint32 { return uint32(StatusUnimplemented) }
