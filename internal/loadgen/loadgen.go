// Package loadgen drives an HTTP endpoint the way a fleet of proxies or
// clients does. Over HTTP/1.1: a fixed set of keep-alive connections, each
// with one request in flight, prebuilt requests written on raw sockets by
// one epoll loop (h1_linux.go) and only the status line and
// Content-Length of the answers parsed, as fast as the server answers or
// paced at a rate. Over h2c (HTTP/2 with
// prior knowledge, as Envoy's HTTP/2 upstreams): a few connections with
// many concurrent streams each (h2c.go). Either way its own CPU per
// request stays small next to the server's it measures, and it allocates
// nothing per request, so no garbage collection of its own lands in the
// latencies it measures.
package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// Options describe one run.
type Options struct {
	Addr string // host:port, loopback in tests
	Path string // request target, e.g. /v1/rate-limit/check
	// Method defaults to POST when there are Bodies, else GET.
	Method string
	Header string // extra header lines, each ending in "\r\n"
	// ConnHeaders are extra header lines by connection (HTTP/1.1):
	// connection i adds ConnHeaders[i%len(ConnHeaders)] to each of its
	// requests, a client of its own per connection, say.
	ConnHeaders []string
	Bodies      [][]byte // request bodies, sent round-robin across all connections; none: requests without one
	Conns       int      // concurrent connections, one request in flight each (HTTP/1.1)
	N           int      // requests in all
	// Rate, above 0, paces the requests (HTTP/1.1): request i is due
	// i/Rate seconds after the start and goes out on a connection that is
	// free by then. Its latency counts from when it was written, so the
	// generator's own lateness in waking up (hundreds of microseconds on
	// an idle virtual machine) is not charged to the server. 0 sends each
	// request as soon as its connection has the previous answer.
	Rate float64
	// H2C speaks HTTP/2 with prior knowledge, Streams requests in flight
	// on each of the Conns connections.
	H2C     bool
	Streams int
	// ContentType is the h2c requests' content type; default
	// application/json (application/grpc for gRPC calls).
	ContentType string
	// Check judges an answer; nil accepts status 200 only. body is only
	// valid during the call.
	Check func(status int, body []byte) error
}

// Result is what a run measured.
type Result struct {
	N         int
	Elapsed   time.Duration
	Latencies []time.Duration // sorted
	CPU       time.Duration   // CPU time of this process during the run
}

// Rate is requests per second.
func (r *Result) Rate() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// Percentile returns the latency at p (0 to 1).
func (r *Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[int(float64(len(r.Latencies)-1)*p)]
}

// Run dials o.Conns connections and sends o.N requests over them. It stops
// at the first failed request or answer.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Conns <= 0 || o.N <= 0 {
		return Result{}, errors.New("loadgen: Conns and N must be set")
	}
	if o.H2C {
		if len(o.Bodies) == 0 || o.Rate > 0 || len(o.ConnHeaders) > 0 {
			return Result{}, errors.New("loadgen: h2c takes Bodies, and neither Rate nor ConnHeaders")
		}
		return runH2C(ctx, o)
	}
	return runH1(ctx, o)
}

// requests are the prebuilt HTTP/1.1 requests: by connection header (one
// set when there are none), then by body.
func (o *Options) requests() [][][]byte {
	method := o.Method
	if method == "" {
		method = "GET"
		if len(o.Bodies) > 0 {
			method = "POST"
		}
	}
	conn := o.ConnHeaders
	if len(conn) == 0 {
		conn = []string{""}
	}
	bodies := o.Bodies
	if len(bodies) == 0 {
		bodies = [][]byte{nil}
	}
	reqs := make([][][]byte, len(conn))
	for h, ch := range conn {
		reqs[h] = make([][]byte, len(bodies))
		for i, b := range bodies {
			r := fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, o.Path, o.Addr)
			if len(o.Bodies) > 0 {
				r = append(r, "Content-Type: application/json\r\n"...)
			}
			r = append(append(r, o.Header...), ch...)
			if len(o.Bodies) > 0 {
				r = fmt.Appendf(r, "Content-Length: %d\r\n", len(b))
			}
			reqs[h][i] = append(append(r, "\r\n"...), b...)
		}
	}
	return reqs
}

// dial opens o.Conns connections to o.Addr.
func dial(ctx context.Context, o *Options) ([]net.Conn, error) {
	conns := make([]net.Conn, o.Conns)
	for i := range conns {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", o.Addr)
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return nil, fmt.Errorf("loadgen: dial: %w", err)
		}
		conns[i] = c
	}
	return conns, nil
}

// result sums up a run that began at t0 with this process's CPU at cpu0:
// the latencies each connection measured, or the run's first error.
func result(ctx context.Context, t0 time.Time, cpu0 time.Duration, lat [][]time.Duration, err error) (Result, error) {
	res := Result{Elapsed: time.Since(t0), CPU: processCPU() - cpu0}
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.Latencies = slices.Concat(lat...)
	slices.Sort(res.Latencies)
	res.N = len(res.Latencies)
	return res, nil
}

// checker is o.Check, or one accepting status 200 only.
func (o *Options) checker() func(int, []byte) error {
	if o.Check != nil {
		return o.Check
	}
	return func(status int, body []byte) error {
		if status != 200 {
			return fmt.Errorf("status %d: %s", status, body)
		}
		return nil
	}
}

var contentLength = []byte("content-length:")

// answer is an HTTP/1.1 response parseResponse found whole.
type answer struct {
	size   int // its bytes, head and body; 0: not all there yet
	status int
	body   []byte
}

// parseResponse parses the response at the start of b, which must have
// a Content-Length body. A response not all in b yet is size 0.
func parseResponse(b []byte) (answer, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= 9 && !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
			return answer{}, fmt.Errorf("bad status line %q", b[:min(len(b), 40)])
		}
		return answer{}, nil
	}
	head := b[:end+2]
	eol := bytes.IndexByte(head, '\n')
	line := head[:eol+1]
	if len(line) < 14 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return answer{}, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return answer{}, fmt.Errorf("bad status line %q", line)
	}
	n := -1
	for rest := head[eol+1:]; len(rest) > 0; {
		eol := bytes.IndexByte(rest, '\n')
		line, rest = rest[:eol+1], rest[eol+1:]
		if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
			v := bytes.TrimSpace(line[len(contentLength):])
			if n, err = strconv.Atoi(string(v)); err != nil || n < 0 {
				return answer{}, fmt.Errorf("bad Content-Length %q", v)
			}
		}
	}
	if n < 0 {
		return answer{}, errors.New("answer without Content-Length")
	}
	size := end + 4 + n
	if len(b) < size {
		return answer{}, nil
	}
	return answer{size: size, status: status, body: b[end+4 : size]}, nil
}

// processCPU is the user+system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
