// Package grpcwire holds what the project's gRPC answers share: the
// encoding of grpc-message.
package grpcwire

// Message percent-encodes b for grpc-message as gRPC's HTTP/2 protocol
// asks and Envoy's PercentEncoding::encode does: every byte below ' ',
// from '~' up, and '%', in upper-case hex.
func Message(b []byte) string {
	const hexUpper = "0123456789ABCDEF"
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c < ' ' || c >= '~' || c == '%' {
			out = append(out, '%', hexUpper[c>>4], hexUpper[c&0xf])
			continue
		}
		out = append(out, c)
	}
	return string(out)
}
