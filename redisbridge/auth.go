package redisbridge

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
)

// bearerToken returns the token of an Authorization value
// "Bearer <token>" (scheme in any case, blanks around the token ignored).
func bearerToken(auth []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(auth) <= len(scheme) || !bytes.EqualFold(auth[:len(scheme)], []byte(scheme)) {
		return nil, false
	}
	tok := bytes.TrimSpace(auth[len(scheme):])
	return tok, len(tok) > 0
}

// keyMatches compares digests in constant time, so neither content nor
// length of the secret leaks through timing.
func keyMatches(got []byte, want [32]byte) bool {
	sum := sha256.Sum256(got)
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// fingerprint names a key in the audit log without revealing it.
func fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

var (
	errMissingToken = &apiError{http.StatusUnauthorized, codeUnauthorized, "Authorization", "missing bearer token"}
	errWrongToken   = &apiError{http.StatusForbidden, codeForbidden, "Authorization", "wrong bearer token"}
)

// authorizeCheck is the one token check of check, batch-check and status
// requests (--check-token), whatever their transport. auth is the
// Authorization header's value.
func (s *Server) authorizeCheck(auth []byte) *apiError {
	if s.set.CheckToken == "" {
		return nil
	}
	tok, ok := bearerToken(auth)
	if !ok {
		return errMissingToken
	}
	if !keyMatches(tok, s.checkSum) {
		return errWrongToken
	}
	return nil
}

// headerBytes returns the first value of the header name, nil when absent.
func headerBytes(r *http.Request, name string) []byte {
	if v := r.Header.Values(name); len(v) > 0 {
		return []byte(v[0])
	}
	return nil
}

// checker guards the net/http check endpoints other than check itself.
func (s *Server) checker(h http.HandlerFunc) http.HandlerFunc {
	if s.set.CheckToken == "" {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if e := s.authorizeCheck(headerBytes(r, "Authorization")); e != nil {
			writeError(w, r, e)
			return
		}
		h(w, r)
	}
}

// adminKey returns the credential of an admin request and the header it
// came in: "Authorization: Bearer x" or, without Authorization,
// "X-Admin-Key: x".
func adminKey(r *http.Request) ([]byte, string) {
	if a := headerBytes(r, "Authorization"); a != nil {
		tok, _ := bearerToken(a)
		return tok, "Authorization"
	}
	return headerBytes(r, "X-Admin-Key"), "X-Admin-Key"
}

type adminHandler func(w http.ResponseWriter, r *http.Request, who string)

// admin guards an admin endpoint. Every request it refuses is an
// admin_denied audit record with the reason (disabled, missing_key,
// wrong_key); the handler audits what it then does.
func (s *Server) admin(action string, h adminHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, from := adminKey(r)
		var e *apiError
		var reason, result string // audit reason, metric result
		switch {
		case s.set.AdminKey == "":
			reason, result = "disabled", "disabled"
			e = &apiError{http.StatusForbidden, codeForbidden, "", "admin API disabled: start the bridge with --admin-key (SLUICE_ADMIN_KEY)"}
		case len(key) == 0:
			reason, result = "missing_key", "unauthorized"
			e = &apiError{http.StatusUnauthorized, codeUnauthorized, "Authorization", "missing admin key (Authorization: Bearer or X-Admin-Key)"}
		case !keyMatches(key, s.adminSum):
			reason, result = "wrong_key", "forbidden"
			e = &apiError{http.StatusForbidden, codeForbidden, from, "wrong admin key"}
		}
		if e != nil {
			s.m.adminOps.WithLabelValues(action, result).Inc()
			attrs := []any{"remote", r.RemoteAddr, "action", action, "reason", reason, "request_id", requestID(r)}
			if len(key) > 0 {
				attrs = append(attrs, "who", fingerprint(key))
			}
			s.audit.Warn("admin_denied", attrs...)
			writeError(w, r, e)
			return
		}
		s.m.adminOps.WithLabelValues(action, "ok").Inc()
		h(w, r, fingerprint(key))
	}
}
