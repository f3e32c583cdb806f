package wasmhost

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/internal/h1pool"
	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// h1client sends the call-outs of plain-HTTP clusters over kept-alive
// HTTP/1.1 connections (internal/h1pool), on the goroutine the call-out
// runs on: it writes the request and reads the answer itself, with the
// connection's deadline as the call-out's timeout. net/http's Transport
// does the same through a reader and a writer goroutine per connection, a
// context and a timer per request, and adds headers Envoy does not send
// (User-Agent, Accept-Encoding: gzip, which it then undoes); with a
// call-out on every request that cost the gateway about a third of its own
// work (docs/deploy.md). The answer is read by readPlainAnswer when it has
// the usual shape, by net/http (http.ReadResponse) otherwise. A
// connection the server closed while it sat idle is not used again
// (h1pool), rather than retried after a request was sent on it, which
// could apply a check twice.
type h1client struct {
	pool h1pool.Pool
}

// errHostClosed: the host closed while the call-out was in flight.
var errHostClosed = errors.New("wasmhost: host closed")

// h1Request is a call-out for h1client: the request as it goes on the
// wire, rendered when the plugin dispatched it.
type h1Request struct {
	addr     string    // host:port of the cluster
	head     bool      // a HEAD request: its answer has no body
	raw      []byte    // request line, headers and body (appendH1Request)
	buf      *[]byte   // raw's array, from calloutBuffers
	valid    bool      // false: HTTP/1.1 cannot carry it, and it is not sent
	deadline time.Time // zero: none
}

// calloutBuffers hold the bytes of call-outs until they are sent: those
// the host's HTTP/1.1 client writes, and those an inproc.Server answers.
var calloutBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// appendH1Request appends to dst a call-out as Envoy's HTTP/1 codec
// writes it: the request line, :authority as Host, the guest's headers
// with lower-case names (pseudo headers and the codec's own left out), the
// body's length as Content-Length, the body. hb is the call-out's
// serialized header map, its layout checked. It reports whether HTTP/1.1
// can carry the request: a method token, and header names and values
// net/http would also send.
func appendH1Request(dst, method []byte, uri string, authority, hb, body []byte) ([]byte, bool) {
	valid := validName(method) && validValue(authority)
	dst = append(append(dst, method...), ' ')
	dst = append(append(dst, uri...), " HTTP/1.1\r\nHost: "...)
	dst = append(append(dst, authority...), "\r\n"...)
	_ = fields.Visit(hb, func(k, v []byte) {
		if len(k) > 0 && k[0] == ':' {
			return
		}
		start := len(dst)
		dst = append(dst, k...)
		name := dst[start:]
		lowerASCII(name)
		switch string(name) {
		case "host", "content-length", "transfer-encoding", "connection":
			dst = dst[:start] // the codec's own
			return
		}
		valid = valid && validName(name) && validValue(v)
		dst = append(append(append(dst, ": "...), v...), "\r\n"...)
	})
	switch string(method) {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		if len(body) == 0 {
			return append(dst, "\r\n"...), valid
		}
	}
	dst = strconv.AppendInt(append(dst, "Content-Length: "...), int64(len(body)), 10)
	return append(append(dst, "\r\n\r\n"...), body...), valid
}

// validName and validValue are httpguts.ValidHeaderFieldName and
// ValidHeaderFieldValue, on bytes.
func validName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

func validValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// do sends r and reads the answer, at most maxBody bytes of body. It
// reports whether the answer had started when an error came: before, it is
// a connection failure or a timeout (Envoy's router answers those), after,
// a reset.
func (c *h1client) do(r *h1Request, maxBody int64) (res *calloutResponse, started bool, err error) {
	conn, err := c.pool.Get(r.addr, r.deadline)
	if errors.Is(err, h1pool.ErrClosed) {
		return nil, false, errHostClosed
	} else if err != nil {
		return nil, false, err
	}
	ok := false
	defer func() { c.pool.Put(conn, ok) }()
	if err := conn.SetDeadline(r.deadline); err != nil {
		return nil, false, err
	}
	if _, err := conn.Write(r.raw); err != nil {
		return nil, false, err
	}
	if !r.head {
		if hm, body, fast, err := readPlainAnswer(conn.R, maxBody); fast {
			if err != nil {
				return nil, true, err
			}
			ok = true
			return &calloutResponse{headers: hm, body: body}, true, nil
		}
	}
	req := postRequest
	if r.head {
		req = headRequest
	}
	hm, body, keep, started, err := readAnswer(conn.R, req, maxBody)
	if err != nil {
		return nil, started, err
	}
	ok = keep
	return &calloutResponse{headers: hm, body: body}, true, nil
}

// readAnswer reads any answer to req from r with http.ReadResponse: its
// header map (":status" first), its body of at most maxBody bytes, and
// whether the connection may carry another exchange. started: the answer
// had begun when an error came.
func readAnswer(r *bufio.Reader, req *http.Request, maxBody int64) (hm fields.Map, body []byte, keep, started bool, err error) {
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(r, req)
		if err != nil {
			return nil, nil, false, false, err
		}
		// Informational answers precede the response (Envoy's codec skips
		// them too).
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	if n := resp.ContentLength; n >= 0 {
		if n > maxBody {
			return nil, nil, false, true, errBodyTooLarge
		}
		body = make([]byte, n)
		_, err = io.ReadFull(resp.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	}
	if err != nil || int64(len(body)) > maxBody {
		return nil, nil, false, true, errors.Join(err, errBodyTooLarge)
	}
	hm = make(fields.Map, 0, len(resp.Header)+1)
	hm = append(hm, [2]string{":status", statusString(resp.StatusCode)})
	for k, vs := range resp.Header {
		name := lowerName(k)
		for _, v := range vs {
			hm = append(hm, [2]string{name, v})
		}
	}
	return hm, body, !resp.Close, true, nil
}

var errBodyTooLarge = errors.New("wasmhost: call-out response body over the limit")

// headRequest and postRequest tell http.ReadResponse whether an answer
// may have a body: only an answer to HEAD has none whatever it says (the
// request is read, never changed).
var (
	headRequest = &http.Request{Method: http.MethodHead}
	postRequest = &http.Request{Method: http.MethodPost}
)

// close closes every connection, the busy ones included: call-outs in
// flight fail at once rather than at their deadline.
func (c *h1client) close() { c.pool.Close() }
