package rls

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/encoding/protowire"
)

// ADS is a client of an xDS management server's aggregated discovery
// service (envoy.service.discovery.v3.AggregatedDiscoveryService, state
// of the world) for the resources of one type, as envoyproxy/ratelimit's
// CONFIG_TYPE=GRPC_XDS_SOTW holds one: it keeps a stream open, gives each
// response's resources to Apply, acknowledges what Apply takes and
// refuses (NACK) what it does not, with its error, and opens a new stream
// when one ends, after a backoff. Its messages are written and read here
// field by field, as the service's own are (wire.go).
type ADS struct {
	// URL is the server's: http:// for gRPC in the clear (h2c), https://
	// over TLS with TLS.
	URL *url.URL
	TLS *tls.Config
	// NodeID is the node the client says it is (Node.id): the server
	// picks the resources of a node by it.
	NodeID string
	// NodeMetadata is the node's metadata (Node.metadata, string values),
	// which a server may pick resources by too.
	NodeMetadata map[string]string
	// Headers are sent with each stream (gRPC metadata): a token the
	// server asks for, say.
	Headers [][2]string
	TypeURL string
	// Apply takes the version of a response and the values of its
	// resources (protobuf); an error refuses them.
	Apply func(version string, resources [][]byte) error
	// Logger gets a warning for each stream that ends, with why, and for
	// each response refused (Apply's error).
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before a new stream (0:
	// 500 ms and 30 s); it doubles from one failed stream to the next, and
	// starts again from MinBackoff once a stream brought a response.
	MinBackoff, MaxBackoff time.Duration
}

// adsPath is the method's path.
const adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// maxADSMessage bounds a response: a whole configuration, as large as a
// server would send (gRPC's default receive limit is 4 MiB).
const maxADSMessage = 64 << 20

// Run holds a stream to the server until ctx ends.
func (a *ADS) Run(ctx context.Context) {
	minB, maxB := a.MinBackoff, a.MaxBackoff
	if minB <= 0 {
		minB = 500 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(30*time.Second, minB)
	}
	tr := &http2.Transport{TLSClientConfig: a.TLS, ReadIdleTimeout: 30 * time.Second, PingTimeout: 10 * time.Second}
	if a.URL.Scheme == "http" {
		tr.AllowHTTP = true
		tr.DialTLSContext = func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	}
	defer tr.CloseIdleConnections()
	accepted := "" // the version last applied, which a new stream starts from
	backoff := minB
	for {
		got, err := a.stream(ctx, tr, &accepted)
		if ctx.Err() != nil {
			return
		}
		if got {
			backoff = minB
		}
		wait := backoff/2 + rand.N(backoff/2+1) // jittered, so that bridges do not come back together
		a.Logger.Warn("xDS stream ended; a new one follows", "server", a.URL.String(), "err", err, "in", wait.String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxB)
	}
}

// stream runs one stream until it fails or ctx ends; got tells whether a
// response came on it.
func (a *ADS) stream(ctx context.Context, tr *http2.Transport, accepted *string) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	send := make(chan []byte, 1)
	send <- a.request(*accepted, "", "")
	go func() {
		for {
			select {
			case <-ctx.Done():
				pw.CloseWithError(ctx.Err())
				return
			case m := <-send:
				if _, err := pw.Write(m); err != nil {
					// The request side is gone: end the stream, rather than
					// read responses it can no longer acknowledge.
					cancel()
					return
				}
			}
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL.JoinPath(adsPath).String(), pr)
	if err != nil {
		return false, err
	}
	for _, h := range a.Headers {
		req.Header.Add(h[0], h[1])
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	res, err := tr.RoundTrip(req)
	if err != nil {
		return false, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return false, fmt.Errorf("HTTP status %d", res.StatusCode)
	}
	if st := res.Header.Get("Grpc-Status"); st != "" { // trailers only: refused at once
		return false, fmt.Errorf("grpc-status %s: %s", st, res.Header.Get("Grpc-Message"))
	}
	br := bufio.NewReader(res.Body)
	for {
		msg, err := readGRPCMessage(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				if st := res.Trailer.Get("Grpc-Status"); st != "" {
					err = fmt.Errorf("grpc-status %s: %s", st, res.Trailer.Get("Grpc-Message"))
				}
			}
			return got, err
		}
		got = true
		version, nonce, resources, err := a.decodeResponse(msg)
		if err == nil {
			err = a.Apply(version, resources)
		}
		var next []byte
		if err != nil {
			a.Logger.Warn("xDS response refused; the configuration in use stays", "server", a.URL.String(), "version", version, "err", err)
			next = a.request(*accepted, nonce, err.Error())
		} else {
			*accepted = version
			next = a.request(version, nonce, "")
		}
		select {
		case send <- next:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

// readGRPCMessage reads one length-prefixed message of a gRPC stream.
func readGRPCMessage(br *bufio.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	switch {
	case head[0] != 0:
		return nil, errors.New("a compressed message, which the client did not offer to read")
	case n > maxADSMessage:
		return nil, fmt.Errorf("a message of %d bytes, above the %d the client reads", n, maxADSMessage)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(br, msg); err != nil {
		return nil, fmt.Errorf("a message cut short: %w", err)
	}
	return msg, nil
}

// request is a DiscoveryRequest framed for the stream: the version last
// applied, the nonce of the response it answers ("" for the first), and
// for a NACK the error (google.rpc.Status, INVALID_ARGUMENT).
func (a *ADS) request(version, nonce, nack string) []byte {
	b := make([]byte, 5, 128)
	b = appendString(b, 1, version)
	b = protowire.AppendTag(b, 2, protowire.BytesType) // node
	b = appendMessage(b, func(b []byte) []byte {
		b = appendString(b, 1, a.NodeID)
		if len(a.NodeMetadata) > 0 {
			b = protowire.AppendTag(b, 3, protowire.BytesType) // metadata, a google.protobuf.Struct
			b = appendMessage(b, a.appendMetadata)
		}
		return appendString(b, 6, "sluice-bridge") // user_agent_name
	})
	b = appendString(b, 4, a.TypeURL)
	b = appendString(b, 5, nonce)
	if nack != "" {
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		b = appendMessage(b, func(b []byte) []byte {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, 3) // INVALID_ARGUMENT
			return appendString(b, 2, nack)
		})
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	return b
}

// appendMetadata appends NodeMetadata as a Struct's fields, in key order:
// each a map entry of the key and a Value with string_value.
func (a *ADS) appendMetadata(b []byte) []byte {
	keys := slices.Sorted(maps.Keys(a.NodeMetadata))
	for _, k := range keys {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = appendMessage(b, func(b []byte) []byte {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			return appendMessage(b, func(b []byte) []byte {
				b = protowire.AppendTag(b, 3, protowire.BytesType) // string_value
				return protowire.AppendString(b, a.NodeMetadata[k])
			})
		})
	}
	return b
}

// appendString appends a string field, unless it is "" (proto3's default).
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// decodeResponse reads a DiscoveryResponse: its version, its nonce, and
// the values of its resources, each an Any of the client's type.
func (a *ADS) decodeResponse(b []byte) (version, nonce string, resources [][]byte, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			return utf8String(v, &version)
		case 2: // google.protobuf.Any
			var typeURL string
			var value []byte
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					return utf8String(v, &typeURL)
				case num == 2 && typ == protowire.BytesType:
					value = v
				}
				return nil
			}); err != nil {
				return err
			}
			if typeURL != a.TypeURL {
				return fmt.Errorf("a resource of type %q among those of %s", typeURL, a.TypeURL)
			}
			resources = append(resources, value)
		case 4:
			var t string
			if err := utf8String(v, &t); err != nil {
				return err
			}
			if t != a.TypeURL {
				return fmt.Errorf("a response of type %q to a request for %s", t, a.TypeURL)
			}
		case 5:
			return utf8String(v, &nonce)
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("the response: %w", err)
	}
	return version, nonce, resources, err
}
