package h2fast

import (
	"net/http"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

// queueAnswer queues the check core's answer on st (mu held), as
// net/http's HTTP/2 server writes a handler's: :status, the headers in
// sorted order, content-length, date; then the body; then the trailers,
// in sorted order, which end the stream.
func (c *conn) queueAnswer(st *stream, resp *checkio.Response) {
	if c.errored() {
		c.closeStream(st) // nothing is written after a GOAWAY with an error
		return
	}
	var order [16]int
	idx := order[:0]
	for i := range resp.Headers {
		idx = append(idx, i)
		for j := len(idx) - 1; j > 0 && resp.Headers[idx[j]].Name < resp.Headers[idx[j-1]].Name; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	end := len(resp.Body) == 0 && len(resp.Trailers) == 0
	c.hbuf.Reset()
	e := c.henc
	_ = e.WriteField(hpack.HeaderField{Name: ":status", Value: statusText(resp.Status)})
	for _, i := range idx {
		h := &resp.Headers[i]
		name := lowerName(h.Name)
		if volatileHeader(name) {
			// Never indexed: its value changes every time, and the
			// encoder keeps no reference to it.
			_ = e.WriteField(hpack.HeaderField{Name: name, Value: unsafe.String(unsafe.SliceData(h.Value), len(h.Value)), Sensitive: true})
		} else {
			_ = e.WriteField(hpack.HeaderField{Name: name, Value: c.intern(h.Value)})
		}
	}
	cl := strconv.AppendInt(c.num[:0], int64(len(resp.Body)), 10)
	_ = e.WriteField(hpack.HeaderField{Name: "content-length", Value: unsafe.String(unsafe.SliceData(cl), len(cl)), Sensitive: true})
	_ = e.WriteField(hpack.HeaderField{Name: "date", Value: checkio.Date()})
	c.writeBlock(st.id, end)
	if end {
		c.localEnd(st)
		return
	}
	if len(resp.Body) > 0 {
		// The stream's body buffer holds the answer now: the request
		// body is no longer needed.
		*st.body = append((*st.body)[:0], resp.Body...)
		st.out = append(st.out, outItem{kind: itemData, data: *st.body, end: len(resp.Trailers) == 0})
	}
	if len(resp.Trailers) > 0 {
		fields := st.trailers[:0] // a call's one grpc-status fits: no allocation
		for _, t := range resp.Trailers {
			f := hpack.HeaderField{Name: lowerName(t.Name), Value: c.intern(t.Value)}
			i := len(fields)
			fields = append(fields, f)
			for ; i > 0 && fields[i].Name < fields[i-1].Name; i-- {
				fields[i], fields[i-1] = fields[i-1], fields[i]
			}
		}
		st.out = append(st.out, outItem{kind: itemHeaders, fields: fields, end: true})
	}
	c.pushOut(st)
}

// volatileHeader: headers whose values rarely repeat; indexing them would
// only push the others out of the table.
func volatileHeader(name string) bool {
	switch name {
	case "x-request-id", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after":
		return true
	}
	return false
}

// lowerNames holds the HTTP/2 names of the check core's header names.
var lowerNames = map[string]string{}

func lowerName(canonical string) string {
	if s, ok := lowerNames[canonical]; ok {
		return s
	}
	return strings.ToLower(canonical)
}

func init() {
	for _, n := range []string{"Content-Type", "X-Request-Id", "X-Ratelimit-Limit", "X-Ratelimit-Remaining",
		"X-Ratelimit-Reset", "X-Ratelimit-Strategy", "Retry-After", "Www-Authenticate"} {
		lowerNames[n] = strings.ToLower(n)
	}
}

// intern returns v as a string the encoder may keep (mu held): the same
// few values (content type, limits, strategies) come again and again.
func (c *conn) intern(v []byte) string {
	if s, ok := c.strs[string(v)]; ok {
		return s
	}
	s := string(v)
	if len(c.strs) < 256 {
		if c.strs == nil {
			c.strs = map[string]string{}
		}
		c.strs[s] = s
	}
	return s
}

var statusTexts [600]string

func statusText(code int) string {
	if code >= 100 && code < len(statusTexts) {
		if s := statusTexts[code]; s != "" {
			return s
		}
	}
	return strconv.Itoa(code)
}

func init() {
	for i := 100; i < len(statusTexts); i++ {
		statusTexts[i] = strconv.Itoa(i)
	}
}

// pushOut writes what st has queued, as far as the client's windows allow
// (mu held). A stream left waiting for a window is in c.blocked.
func (c *conn) pushOut(st *stream) {
	if c.dead || st.closed {
		return
	}
	for len(st.out) > 0 {
		it := &st.out[0]
		if it.kind == itemReset {
			code := it.code
			st.out = st.out[:0]
			c.resetStream(st.id, code)
			return
		}
		n, done := c.send(st, it, &st.sendWindow)
		if st.back != nil && n > 0 {
			st.back.delivered(st, n)
		}
		if !done {
			return
		}
		end := it.end
		st.out[0] = outItem{}
		st.out = st.out[1:]
		if end {
			c.localEnd(st)
			return
		}
	}
}

// flushBlocked retries the streams waiting for a window (mu held).
func (c *conn) flushBlocked() {
	if len(c.blocked) == 0 {
		return
	}
	waiting := c.blocked
	c.blocked = nil
	for _, st := range waiting {
		c.pushOut(st)
	}
}

// localEnd: our side of st is complete (mu held). A check whose client is
// still sending is reset with NO_ERROR, as net/http does once a handler
// answered without reading the whole body.
func (c *conn) localEnd(st *stream) {
	st.localEnded = true
	switch {
	case st.back != nil:
		c.maybeDone(st)
	case st.state == stateOpen:
		c.resetStream(st.id, http2.ErrCodeNo)
	default:
		c.closeStream(st)
	}
}

// answerHeaderListTooLong answers a request whose header list is over
// maxHeaderListSize as net/http's server does (its 431 handler).
func (c *conn) answerHeaderListTooLong(st *stream) {
	const body = "<h1>HTTP Error 431</h1><p>Request Header Field(s) Too Large</p>"
	st.body = bodyPool.Get().(*[]byte)
	st.answering = true
	var resp checkio.Response
	resp.Status = http.StatusRequestHeaderFieldsTooLarge
	resp.Set("Content-Type", http.DetectContentType([]byte(body)))
	resp.Body = append(resp.Body, body...)
	c.queueAnswer(st, &resp)
}

// inflow is the credit a peer has to send us DATA, and what we consumed
// and not yet returned, as net/http keeps it.
type inflow struct {
	avail  int32
	unsent int32
}

func (f *inflow) init(n int32) { f.avail = n }

// add returns n bytes of credit; it reports how much to send in a
// WINDOW_UPDATE now: updates wait until they are at least
// inflowMinRefresh or would double the peer's window.
func (f *inflow) add(n int) int32 {
	unsent := int64(f.unsent) + int64(n)
	if unsent+int64(f.avail) > 1<<31-1 {
		unsent = 1<<31 - 1 - int64(f.avail) // a misbehaving caller; never past the maximum
	}
	f.unsent = int32(unsent)
	if f.unsent < inflowMinRefresh && f.unsent < f.avail {
		return 0
	}
	f.avail += f.unsent
	send := f.unsent
	f.unsent = 0
	return send
}

// take consumes n bytes of credit, false when there is not enough.
func (f *inflow) take(n uint32) bool {
	if n > uint32(f.avail) {
		return false
	}
	f.avail -= int32(n)
	return true
}

func takeInflows(a, b *inflow, n uint32) bool {
	if n > uint32(a.avail) || n > uint32(b.avail) {
		return false
	}
	a.avail -= int32(n)
	b.avail -= int32(n)
	return true
}
