package wasmhost

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"syscall"

	"github.com/sluicehq/sluice/internal/grpcwire"
)

// resetBefore opens the body of Envoy's router's answer to an exchange
// reset before the upstream's answer began (router.cc, onUpstreamReset).
const resetBefore = "upstream connect error or disconnect/reset before headers. reset reason: "

// UpstreamFailure is the local reply Envoy's router sends in place of an
// upstream's answer when the exchange failed before that answer's
// headers, and the response flag Envoy's access log shows for it
// (source/common/router/router.cc, onUpstreamTimeoutAbort and
// onUpstreamReset, streamResetReasonToResponseFlag):
//
//   - timedOut: 504 "upstream request timeout", UT;
//   - no connection could be made: 503, reset reason "remote connection
//     failure" with the transport's failure reason (the errno of a refused
//     or failed connect, or the TLS error as BoringSSL names it), UF;
//   - the upstream's answer was not HTTP: 502, "protocol error", UPE;
//   - anything else, the connection ended before the answer: 503,
//     "connection termination", UC.
//
// The reply's GrpcStatus is unset (-1): a gRPC client gets the status
// mapped from the HTTP one, as from Envoy.
func UpstreamFailure(err error, timedOut bool) (reply LocalResponse, flag string) {
	reply = LocalResponse{Headers: [][2]string{{"content-type", "text/plain"}}, GrpcStatus: -1}
	var body string
	switch {
	case timedOut:
		reply.Status, body, flag = http.StatusGatewayTimeout, "upstream request timeout", "UT"
	case err != nil && connectFailed(err):
		reply.Status, body, flag = http.StatusServiceUnavailable, resetBefore+"remote connection failure"+transportFailure(err), "UF"
	case err != nil && malformed(err):
		reply.Status, body, flag = http.StatusBadGateway, resetBefore+"protocol error", "UPE"
	default: // the connection ended before the answer, or no cause was given
		reply.Status, body, flag = http.StatusServiceUnavailable, resetBefore+"connection termination", "UC"
	}
	reply.Body = []byte(body)
	return reply, flag
}

// connectFailed reports whether err is a connection that could not be
// made: a failed dial, or a TLS handshake that failed.
func connectFailed(err error) bool {
	var op *net.OpError
	var alert tls.AlertError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &alert) || tlsFailure(err) != ""
}

// transportFailure is the ", transport failure reason: ..." of a
// connection that could not be made, as Envoy words it: the TLS error as
// Envoy's TLS socket reports BoringSSL's, or the connect's errno (111, a
// refused connection, for a failure without one). A handshake the server
// refused has none: Envoy names BoringSSL's alert, which Go does not keep.
func transportFailure(err error) string {
	const reason = ", transport failure reason: "
	if f := tlsFailure(err); f != "" {
		return reason + f
	}
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return ""
	}
	errno := syscall.ECONNREFUSED
	errors.As(err, &errno)
	return reason + "delayed connect error: " + strconv.Itoa(int(errno))
}

// tlsFailure is BoringSSL's error, as Envoy reports it, for a handshake
// that failed on the gateway's side: a certificate it does not trust, or
// a server that does not speak TLS (which net/http reports in words of
// its own when the server answered in HTTP); "" for any other error.
func tlsFailure(err error) string {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname):
		return "TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end"
	case errors.As(err, &record) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return "TLS_error:|268435703:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end"
	}
	return ""
}

// malformed reports whether err is an upstream answer that was not HTTP.
// net/http gives most such errors no type of their own (ReadResponse's
// "malformed HTTP ..." ones, httputil.ReverseProxy's refusal of a protocol
// switch nobody asked for), so their text is read.
func malformed(err error) bool {
	var pe textproto.ProtocolError
	if errors.As(err, &pe) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "malformed HTTP") || strings.Contains(s, "backend tried to switch")
}

// WriteLocalResponse writes l to w as Envoy sends a local reply
// (Utility::sendLocalReply) to r: the plugin's answer, a failed VM's, or
// the router's in place of an upstream's (UpstreamFailure). To a gRPC
// request the answer is gRPC's: 200 with no body, the status in
// grpc-status (l.GrpcStatus, or mapped from l.Status) and the body,
// percent-encoded, in grpc-message; a gRPC client would make nothing of
// a 429 with a JSON body. To any other, l.Status with l.Body, as
// text/plain unless l.Headers give a Content-Type.
func WriteLocalResponse(w http.ResponseWriter, r *http.Request, l *LocalResponse) {
	for _, kv := range l.Headers {
		if !strings.HasPrefix(kv[0], ":") {
			w.Header().Add(kv[0], kv[1])
		}
	}
	if isGRPC(r) {
		h := w.Header()
		h["Content-Type"] = []string{"application/grpc"}
		if h.Get("Grpc-Status") == "" {
			code := l.GrpcStatus
			if code < 0 || code > grpcMaxStatus {
				code = grpcStatusOf(l.Status)
			}
			h["Grpc-Status"] = []string{strconv.Itoa(int(code))}
		}
		if len(l.Body) > 0 && r.Method != http.MethodHead {
			h["Grpc-Message"] = []string{grpcwire.Message(l.Body)}
		}
		h.Del("Content-Length")
		w.WriteHeader(http.StatusOK) // trailers only: the headers end the stream
		return
	}
	if w.Header().Get("Content-Type") == "" && len(l.Body) > 0 {
		w.Header().Set("Content-Type", "text/plain")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(l.Body)))
	w.WriteHeader(l.Status)
	_, _ = w.Write(l.Body)
}

// isGRPC is Envoy's Grpc::Common::hasGrpcContentType: the content type is
// application/grpc, alone or with a "+" suffix (application/grpc-web is
// not gRPC).
func isGRPC(r *http.Request) bool {
	const grpc = "application/grpc"
	v := r.Header["Content-Type"]
	if len(v) == 0 || !strings.HasPrefix(v[0], grpc) {
		return false
	}
	return len(v[0]) == len(grpc) || v[0][len(grpc)] == '+'
}

// gRPC status codes the host gives or maps to.
const (
	grpcUnknown          = 2
	grpcPermissionDenied = 7
	grpcUnimplemented    = 12
	grpcInternal         = 13
	grpcUnavailable      = 14
	grpcUnauthenticated  = 16
	grpcMaxStatus        = 16
)

// grpcStatusOf is Envoy's Grpc::Utility::httpToGrpcStatus, gRPC's
// mapping of HTTP statuses (doc/http-grpc-status-mapping.md).
func grpcStatusOf(status int) int32 {
	switch status {
	case 400:
		return grpcInternal
	case 401:
		return grpcUnauthenticated
	case 403:
		return grpcPermissionDenied
	case 404:
		return grpcUnimplemented
	case 429, 502, 503, 504:
		return grpcUnavailable
	}
	return grpcUnknown
}
