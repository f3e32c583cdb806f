package redisbridge

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
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
	_ = json.NewEncoder(w).Encode(struct {
		Error apiError `json:"error"`
	}{apiError{Code: code, Message: msg, Details: details, RequestID: requestID(r)}})
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

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req_" + hex.EncodeToString(b[:])
}
