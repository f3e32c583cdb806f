package wasmhost

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// Middleware runs every request through the plugin as Envoy's HTTP filter
// chain would: request headers (the plugin may rewrite them, pause for a
// call-out or answer locally), then next, then response headers (applied
// before next's WriteHeader), then the stream's end. A failed VM answers as
// Options.FailurePolicy says; a stream the plugin resets is aborted.
func (h *Host) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id string
		if v := r.Header["X-Request-Id"]; len(v) > 0 {
			id = v[0]
		}
		if id == "" {
			id = NewRequestID()
		}
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		// Only a certificate the listener verified names the client
		// (tls.RequireAndVerifyClientCert, tlsfiles.CAs.RequireClients).
		var peer *x509.Certificate
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			peer = r.TLS.VerifiedChains[0][0]
		}
		path := RequestPath(r)
		s := pooledStream()
		s.start(h, RequestInfo{
			Method: r.Method, Path: path, Host: r.Host, Scheme: scheme,
			SourceAddress: r.RemoteAddr, RequestID: id, Protocol: ProtocolName(r),
			EndOfStream:     r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0,
			PeerCertificate: peer,
		}, len(r.Header)+1)
		for k, vs := range r.Header {
			name := lowerName(k)
			for _, v := range vs {
				s.req = append(s.req, [2]string{name, v})
			}
		}
		s.addRequestID()
		defer func() {
			if s.close() {
				s.recycle()
			}
		}()
		res, err := s.RequestHeaders(r.Context())
		switch {
		case err != nil && r.Context().Err() != nil:
			return // the client is gone
		case errors.Is(err, ErrStreamReset):
			panic(http.ErrAbortHandler)
		case err != nil:
			http.Error(w, "plugin unavailable", http.StatusServiceUnavailable)
			return
		case res.Local != nil:
			WriteLocalResponse(w, r, res.Local)
			return
		}
		if res.Modified {
			applyRequest(r, res.Headers, path)
		}
		rw := &s.rw
		*rw = responseWriter{ResponseWriter: w, s: s, r: r, h: h, held: rw.held[:0]}
		next.ServeHTTP(rw, r)
		rw.end()
	})
}

// NewRequestID makes an x-request-id for a request without one, as
// Envoy's connection manager does; Middleware makes one when the request
// has none. It needs to be unique, not secret: 32 hex digits, a random
// half drawn once per process and a counter, rather than random numbers
// drawn for every request.
func NewRequestID() string {
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], requestIDPrefix)
	binary.BigEndian.PutUint64(raw[8:], requestIDSeq.Add(1))
	var b [32]byte
	hex.Encode(b[:], raw[:])
	return string(b[:])
}

var (
	requestIDPrefix = rand.Uint64()
	requestIDSeq    atomic.Uint64
)

// RequestPath is r's :path: the request target as it came, as Envoy
// passes it on (without path normalization), rather than the URL
// re-escaped; an absolute-form or asterisk target is its URL's path.
// After Middleware's plugin has run, it is the :path the plugin left.
func RequestPath(r *http.Request) string {
	if strings.HasPrefix(r.RequestURI, "/") {
		return r.RequestURI
	}
	return r.URL.RequestURI()
}

// ProtocolName is the request's protocol as Envoy names it, in the
// property request.protocol and in access logs
// (Http::Utility::getProtocolString): "HTTP/2" where net/http says
// "HTTP/2.0".
func ProtocolName(r *http.Request) string {
	switch r.ProtoMajor {
	case 2:
		return "HTTP/2"
	case 3:
		return "HTTP/3"
	}
	return r.Proto
}

// applyRequest makes r carry the headers the plugin left; path is the
// :path it was given.
func applyRequest(r *http.Request, hdrs [][2]string, path string) {
	nh := make(http.Header, len(hdrs))
	for _, kv := range hdrs {
		switch kv[0] {
		case ":path":
			if kv[1] != path {
				if u, err := r.URL.Parse(kv[1]); err == nil {
					r.URL = u
					r.RequestURI = kv[1]
				}
			}
		case ":authority":
			r.Host = kv[1]
		case ":method":
			r.Method = kv[1]
		default:
			if !strings.HasPrefix(kv[0], ":") {
				nh.Add(kv[0], kv[1])
			}
		}
	}
	r.Header = nh
}

// responseHeadersOf is ResponseHeaders with the headers of a
// ResponseWriter, put in the stream's map as they are read; endOfStream:
// no body follows.
func (s *Stream) responseHeadersOf(ctx context.Context, status int, hdr http.Header, endOfStream bool) (Result, error) {
	if err := s.openResponse(status, len(hdr)); err != nil {
		return Result{}, err
	}
	for k, vs := range hdr {
		name := lowerName(k)
		for _, v := range vs {
			s.resp = append(s.resp, [2]string{name, v})
		}
	}
	return s.responseHeaders(ctx, endOfStream)
}

// responseWriter runs the plugin's response-header callback just before the
// status line goes out, and its body callback on each part of the body,
// one part behind: the last part, or the end of a body, goes with the end
// of the stream, as Envoy's last data frame does. A body callback cannot
// hold or change the body; each part has gone out when the plugin reads it.
type responseWriter struct {
	http.ResponseWriter
	s           *Stream
	r           *http.Request
	h           *Host
	wroteHeader bool
	discard     bool   // the plugin replaced the response
	held        []byte // the last part written, for its body callback
	holding     bool
}

func (rw *responseWriter) WriteHeader(code int) { rw.writeHeader(code, false) }

// end ends the response: its headers, when none went out (there is no
// body), else the body's last part.
func (rw *responseWriter) end() {
	if !rw.wroteHeader {
		rw.writeHeader(http.StatusOK, true)
		return
	}
	if !rw.discard {
		rw.body(rw.held, true)
	}
}

// body runs the body callback for part; a plugin that would hold the
// body is logged, and the body passes.
func (rw *responseWriter) body(part []byte, endOfStream bool) {
	if err := rw.s.ResponseBody(part, endOfStream); err != nil && rw.h.opts.Logger != nil {
		rw.h.opts.Logger.Warn("response body", "err", err)
	}
}

func (rw *responseWriter) writeHeader(code int, endOfStream bool) {
	if rw.wroteHeader {
		return
	}
	rw.wroteHeader = true
	res, err := rw.s.responseHeadersOf(rw.r.Context(), code, rw.Header(), endOfStream)
	switch {
	case errors.Is(err, ErrStreamReset):
		panic(http.ErrAbortHandler)
	case err != nil:
		rw.discard = true
		clear(rw.Header())
		http.Error(rw.ResponseWriter, "plugin unavailable", http.StatusServiceUnavailable)
		return
	case res.Local != nil:
		rw.discard = true
		clear(rw.Header())
		WriteLocalResponse(rw.ResponseWriter, rw.r, res.Local)
		return
	}
	if !res.Modified {
		rw.ResponseWriter.WriteHeader(code)
		return
	}
	out := rw.Header()
	clear(out)
	// The values share one array, as net/textproto's reader gives them: a
	// name's first value is a one-element slice of it, capped so that a
	// second value of the name is appended to a copy.
	vals := make([]string, len(res.Headers))
	for i, kv := range res.Headers {
		if kv[0] == ":status" {
			if n, err := strconv.Atoi(kv[1]); err == nil {
				code = n
			}
			continue
		}
		k := canonicalName(kv[0])
		if vs, ok := out[k]; ok {
			out[k] = append(vs, kv[1])
			continue
		}
		vals[i] = kv[1]
		out[k] = vals[i : i+1 : i+1]
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *responseWriter) Write(b []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.discard {
		return len(b), nil
	}
	n, err := rw.ResponseWriter.Write(b)
	if rw.holding {
		rw.body(rw.held, false)
	}
	rw.held, rw.holding = append(rw.held[:0], b[:n]...), true
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (rw *responseWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

func slogLevel(l LogLevel) slog.Level {
	switch {
	case l <= LogLevelDebug:
		return slog.LevelDebug
	case l == LogLevelInfo:
		return slog.LevelInfo
	case l == LogLevelWarn:
		return slog.LevelWarn
	}
	return slog.LevelError
}
