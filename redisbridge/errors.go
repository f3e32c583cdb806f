package redisbridge

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/policy"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/rules"
)

// Error codes of the envelope.
const (
	codeInvalidInput       = "INVALID_INPUT"
	codeInvalidLimit       = "INVALID_LIMIT"
	codeInvalidAlgorithm   = "INVALID_ALGORITHM"
	codeUnauthorized       = "UNAUTHORIZED"
	codeForbidden          = "FORBIDDEN"
	codeNotFound           = "NOT_FOUND"
	codeConflict           = "CONFLICT"
	codeTooLarge           = "PAYLOAD_TOO_LARGE"
	codeInternal           = "INTERNAL_ERROR"
	codeServiceUnavailable = "SERVICE_UNAVAILABLE"
)

// apiError is an answer other than success: status, code, and the details
// of the envelope. Field names the part of the request at fault (a body
// field such as "checks[1].limit", "body", "path", a header); it is empty
// only when nothing in the request is (the store failed).
type apiError struct {
	status        int
	code          string
	field, reason string
}

func (e *apiError) Error() string {
	if e.field == "" {
		return e.reason
	}
	return e.field + ": " + e.reason
}

// invalid is a 400 for the request field at fault.
func invalid(code, field, reason string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, field: field, reason: reason}
}

// bodyTooLarge is the answer to a body over maxBody.
var bodyTooLarge = &apiError{http.StatusRequestEntityTooLarge, codeTooLarge, "body", "larger than 65536 bytes"}

// storeError is the answer to a failed store call: 503 when the store
// could not be reached (the plugin applies its failure mode), 500 otherwise.
func storeError(err error) *apiError {
	if errors.Is(err, policy.ErrUnavailable) {
		return &apiError{http.StatusServiceUnavailable, codeServiceUnavailable, "", "policy store unavailable"}
	}
	if errors.Is(err, store.ErrUnavailable) {
		return &apiError{http.StatusServiceUnavailable, codeServiceUnavailable, "", "counter store unavailable"}
	}
	return &apiError{http.StatusInternalServerError, codeInternal, "", "check failed"}
}

type envelope struct {
	Error envelopeError `json:"error"`
}

type envelopeError struct {
	Code      string          `json:"code"`
	Message   string          `json:"message"`
	Details   envelopeDetails `json:"details"`
	RequestID string          `json:"request_id"`
}

type envelopeDetails struct {
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason"`
}

// writeTo fills out with the error envelope, for every transport alike.
func (e *apiError) writeTo(out *checkio.Response, reqID string) {
	out.Status = e.status
	out.Set("Content-Type", "application/json")
	if e.status == http.StatusServiceUnavailable {
		out.Set("Retry-After", "1")
	}
	if e.status == http.StatusUnauthorized {
		out.Set("Www-Authenticate", "Bearer")
	}
	b, err := json.Marshal(envelope{envelopeError{Code: e.code, Message: e.Error(),
		Details: envelopeDetails{Field: e.field, Reason: e.reason}, RequestID: reqID}})
	if err != nil { // only strings: cannot happen
		b = []byte(`{"error":{"code":"INTERNAL_ERROR","message":"encoding the error failed","details":{"reason":"encoding the error failed"},"request_id":""}}`)
	}
	out.Body = append(append(out.Body, b...), '\n')
}

// writeError answers r with the error envelope.
func writeError(w http.ResponseWriter, r *http.Request, e *apiError) {
	var out checkio.Response
	e.writeTo(&out, requestID(r))
	writeResponse(w, &out)
}

// writeResponse writes out through net/http. Header names in out are
// canonical already.
func writeResponse(w http.ResponseWriter, out *checkio.Response) {
	h := w.Header()
	for _, x := range out.Headers {
		h[x.Name] = []string{string(x.Value)}
	}
	w.WriteHeader(out.Status)
	_, _ = w.Write(out.Body)
	for _, x := range out.Trailers {
		h[http.TrailerPrefix+x.Name] = []string{string(x.Value)}
	}
}

// wireError is the answer to a body the wire decoder refused. Its errors
// read "invalid check request: <field>: <reason>", or "...: body ..." for
// a body that is not a JSON object.
func wireError(err error) *apiError {
	msg := strings.TrimPrefix(err.Error(), rules.ErrInvalidCheck.Error()+": ")
	if rest, ok := strings.CutPrefix(msg, "body "); ok {
		return invalid(codeInvalidInput, "body", rest)
	}
	field, reason, ok := strings.Cut(msg, ": ")
	if !ok {
		return invalid(codeInvalidInput, "body", msg)
	}
	// An element that is not an object is reported as "limits[i].(limit)".
	field = strings.TrimSuffix(field, ".(limit)")
	return invalid(codeInvalidInput, field, reason)
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
