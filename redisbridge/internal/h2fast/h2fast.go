// Package h2fast serves cleartext HTTP/2 (h2c) connections to the bridge,
// the transport Envoy and Istio use: it answers the plugin's check
// requests itself and hands every other stream to net/http's HTTP/2
// server.
//
// The check path is the bridge's whole load, and net/http's HTTP/2 server
// costs about three times the CPU per request of the HTTP/1.1 fast path
// (a handler goroutine, a request and a response writer, header maps and
// several goroutine hand-offs per stream). So, as internal/h1fast does for
// HTTP/1.1, this package owns the connection: it reads and writes frames
// with golang.org/x/net/http2's Framer and hpack, answers a stream that is
// exactly a check,
//
//	POST /v1/rate-limit/check, :scheme http, an :authority, at most one
//	Content-Length and Authorization, no connection-specific headers,
//	Expect or Trailer,
//
// by calling the bridge's check core (a checkio.Handler, the one net/http's
// handler calls too); answers Envoy's rate limit service's gRPC calls,
// which are as exact but at RLSPath with a gRPC content type, likewise
// with Options.RLS (its answers end with trailers); and relays every other
// stream (other paths and
// methods, odd requests) to net/http's HTTP/2 server over an in-memory
// connection of its own (relay.go), so that net/http decides those exactly
// as it would on its own.
//
// The connection's own protocol (SETTINGS, PING, WINDOW_UPDATE, RST_STREAM,
// GOAWAY, stream states and limits, flow control, the idle timeout and
// graceful shutdown) follows net/http's HTTP/2 server rule by rule, with
// its settings; the tests compare both on the same frames.
package h2fast

import (
	"bufio"
	"context"
	"net"
	"sync"
	"time"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

// What net/http's HTTP/2 server advertises (Go 1.26, a Server with no
// HTTP2 settings, as the bridge's): a client sees the same settings from
// both, and TestSettings_SameAsNetHTTP keeps them so.
const (
	maxConcurrentStreams = 250
	initialWindowSize    = 1 << 20 // per stream, for request bodies
	connWindowSize       = 1 << 20
	maxReadFrameSize     = 1 << 20
	maxHeaderListSize    = 1<<20 + 320 // http.DefaultMaxHeaderBytes, plus 32 bytes for each of 10 fields
	headerTableSize      = 4096
)

// Protocol constants of net/http's HTTP/2 server.
const (
	defaultWindow      = 65535           // RFC 9113 initial windows
	defaultMaxFrame    = 16384           // RFC 9113 initial SETTINGS_MAX_FRAME_SIZE
	inflowMinRefresh   = 4 << 10         // window updates smaller than this wait for more
	settingsTimeout    = 2 * time.Second // the client's first SETTINGS must come within
	goAwayTimeout      = time.Second     // from a GOAWAY (after the last stream, when graceful) to closing
	maxQueuedControl   = 10000           // control frames a client that does not read may queue
	writeTimeout       = 10 * time.Second
	defaultIdleTimeout = 2 * time.Minute
	checkPath          = "/v1/rate-limit/check"
)

// RLSPath is the path of Envoy's rate limit service's gRPC method.
const RLSPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// IsGRPC reports whether a content type is gRPC's with protobuf messages
// (application/grpc, or its +proto form), what the rate limit service
// reads.
func IsGRPC(contentType string) bool {
	return contentType == "application/grpc" || contentType == "application/grpc+proto"
}

// Options configure a Server.
type Options struct {
	// Handler answers check requests: the bridge's check core.
	Handler checkio.Handler
	// RLS answers ShouldRateLimit calls; nil relays them to net/http.
	RLS checkio.Handler
	// Handoff gives net/http's server a connection to serve, on which the
	// relay speaks HTTP/2 with prior knowledge. It reports false when
	// net/http no longer serves (shutting down).
	Handoff func(net.Conn) bool
	// MaxBody is the largest check body net/http's handler reads (the
	// bridge's 64 KiB); a larger one is answered with the handler's error.
	MaxBody int
	// IdleTimeout closes connections without streams, as net/http's
	// IdleTimeout does (default 2 minutes).
	IdleTimeout time.Duration
	// MaxAge, when not 0, shuts a connection down gracefully once it is
	// about that old (checkio.ConnAge; conn.onAged), as gRPC servers' max
	// connection age does: its client opens a new one, possibly to
	// another bridge, and the old one closes after its last stream.
	MaxAge time.Duration
}

// Server serves h2c connections handed to it by ServeConn.
type Server struct {
	o       Options
	mu      sync.Mutex
	conns   map[*conn]struct{}
	closing bool
	wg      sync.WaitGroup
	work    chan *stream // to a worker waiting for a check
}

// New returns a Server.
func New(o Options) *Server {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = defaultIdleTimeout
	}
	return &Server{o: o, conns: map[*conn]struct{}{}, work: make(chan *stream)}
}

// ServeConn serves c until the connection ends. r reads c and holds what
// was read of it already: the client preface comes first.
func (s *Server) ServeConn(c net.Conn, r *bufio.Reader) {
	cc := newConn(s, c, r)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.conns[cc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, cc)
		s.mu.Unlock()
		s.wg.Done()
	}()
	cc.serve()
}

// Shutdown sends every connection a GOAWAY, as net/http does on its
// Shutdown, and waits until their streams are done and they are closed;
// when ctx ends first, it closes them.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.startGracefulShutdown()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		<-done
		return ctx.Err()
	}
}
