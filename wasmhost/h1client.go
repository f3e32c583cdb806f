package wasmhost

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strconv"
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
// work (docs/deploy.md). The answer is parsed by net/http
// (http.ReadResponse). A connection the server closed while it sat idle is
// not used again (h1pool), rather than retried after a request was sent
// on it, which could apply a check twice.
type h1client struct {
	pool h1pool.Pool
}

// errHostClosed: the host closed while the call-out was in flight.
var errHostClosed = errors.New("wasmhost: host closed")

// h1Request is a call-out for h1client.
type h1Request struct {
	addr                    string // host:port of the cluster
	method, path, authority string
	headers                 fields.Map // without pseudo headers
	body                    []byte
	deadline                time.Time // zero: none
}

// validH1Request reports whether the call-out can be written as HTTP/1.1:
// a method token and header names and values net/http would also send.
func validH1Request(r *h1Request) bool {
	if !httpguts.ValidHeaderFieldName(r.method) || !httpguts.ValidHeaderFieldValue(r.authority) {
		return false
	}
	for _, kv := range r.headers {
		if !httpguts.ValidHeaderFieldName(kv[0]) || !httpguts.ValidHeaderFieldValue(kv[1]) {
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
	writeH1Request(conn.W, r)
	if err := conn.W.Flush(); err != nil {
		return nil, false, err
	}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(conn.R, &http.Request{Method: r.method})
		if err != nil {
			return nil, false, err
		}
		// Informational answers precede the response (Envoy's codec skips
		// them too).
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil || int64(len(body)) > maxBody {
		return nil, true, errors.Join(err, errBodyTooLarge)
	}
	hm := make(fields.Map, 0, len(resp.Header)+1)
	hm = append(hm, [2]string{":status", strconv.Itoa(resp.StatusCode)})
	for k, vs := range resp.Header {
		for _, v := range vs {
			hm.Add(k, v)
		}
	}
	ok = !resp.Close
	return &calloutResponse{headers: hm, body: body}, true, nil
}

var errBodyTooLarge = errors.New("wasmhost: call-out response body over the limit")

// writeH1Request writes r's request line, headers and body to w, as
// Envoy's HTTP/1 codec would: :authority as Host, the body's length as
// Content-Length.
func writeH1Request(w *bufio.Writer, r *h1Request) {
	w.WriteString(r.method)
	w.WriteByte(' ')
	w.WriteString(r.path)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(r.authority)
	w.WriteString("\r\n")
	for _, kv := range r.headers {
		switch kv[0] {
		case "host", "content-length", "transfer-encoding", "connection":
			continue // the codec's own
		}
		w.WriteString(kv[0])
		w.WriteString(": ")
		w.WriteString(kv[1])
		w.WriteString("\r\n")
	}
	if len(r.body) > 0 || r.method == http.MethodPost || r.method == http.MethodPut || r.method == http.MethodPatch {
		w.WriteString("Content-Length: ")
		w.WriteString(strconv.Itoa(len(r.body)))
		w.WriteString("\r\n")
	}
	w.WriteString("\r\n")
	w.Write(r.body)
}

// close closes every connection, the busy ones included: call-outs in
// flight fail at once rather than at their deadline.
func (c *h1client) close() { c.pool.Close() }
