package redisbridge

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync/atomic"
)

// Error codes of the envelope (seed 002).
const (
	codeInvalidInput       = "INVALID_INPUT"
	codeInvalidLimit       = "INVALID_LIMIT"
	codeInvalidStrategy    = "INVALID_STRATEGY"
	codeUnauthorized       = "UNAUTHORIZED"
	codeForbidden          = "FORBIDDEN"
	codeNotFound           = "NOT_FOUND"
	codeRateLimited        = "RATE_LIMITED"
	codeTooLarge           = "PAYLOAD_TOO_LARGE"
	codeInternal           = "INTERNAL_ERROR"
	codeServiceUnavailable = "SERVICE_UNAVAILABLE"
)

type apiError struct {
	Code      string         `json:"code"`
	Message   string         `json:"message"`
	Details   map[string]any `json:"details,omitempty"`
	RequestID string         `json:"request_id"`
}

// writeError answers with the error envelope.
func writeError(w http.ResponseWriter, r *http.Request, status int, code, msg string, details map[string]any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(code, msg, details, requestID(r)))
}

// errorBody is the envelope as JSON, newline-terminated.
func errorBody(code, msg string, details map[string]any, reqID string) []byte {
	b, err := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Code: code, Message: msg, Details: details, RequestID: reqID}})
	if err != nil { // details hold only strings and numbers
		b = []byte(`{"error":{"code":"INTERNAL_ERROR","message":"encoding the error failed","request_id":""}}`)
	}
	return append(b, '\n')
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// requestID is the caller's X-Request-Id, or one made up for this request
// (set on the request by the middleware, so every log line can carry it).
func requestID(r *http.Request) string {
	return r.Header.Get("X-Request-Id")
}

// Request ids are a random per-process prefix and a counter: unique, not
// secret, and made without a system call per request.
var (
	reqIDPrefix = func() [6]byte {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return b
	}()
	reqIDSeq atomic.Uint64
)

func newRequestID() string {
	var b [28]byte
	copy(b[:], "req_")
	hex.Encode(b[4:16], reqIDPrefix[:])
	n := reqIDSeq.Add(1)
	for i := 27; i >= 16; i-- {
		b[i] = hexDigits[n&0xf]
		n >>= 4
	}
	return string(b[:])
}

const hexDigits = "0123456789abcdef"
