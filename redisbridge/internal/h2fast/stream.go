package h2fast

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

// stream is one client stream: a check answered here, or (back set) a
// stream relayed to net/http.
type stream struct {
	c          *conn
	id         uint32
	state      streamState
	closed     bool
	sendWindow int32  // the client's window for what we send on it
	inflow     inflow // the client's credit on it
	out        []outItem
	localEnded bool // our side of it is sent, END_STREAM included
	gotTrailer bool

	// A check.
	body      *[]byte // pooled
	bodyLen   int64
	declLen   int64 // Content-Length, -1 when none
	rls       bool  // a ShouldRateLimit call, for Options.RLS
	auth      string
	reqID     string
	hasReqID  bool
	timeout   string               // a call's grpc-timeout
	trailers  [2]hpack.HeaderField // room for an answer's trailers
	bodyErr   error
	req       checkio.Request // what the check core is given
	answering bool            // the check core has the request: no more body
	running   bool            // its goroutine runs

	// A relayed stream.
	back *backLeg
	rs   relayState
}

func newStream(c *conn, id uint32) *stream {
	st := &stream{c: c, id: id, state: stateOpen, sendWindow: c.initWindow, declLen: -1}
	st.inflow.init(initialWindowSize)
	return st
}

// outItem is something queued for the client on a stream, in order.
type outItem struct {
	kind   itemKind
	fields []hpack.HeaderField // itemHeaders
	data   []byte              // itemData
	end    bool                // END_STREAM after it
	code   http2.ErrCode       // itemReset
}

type itemKind uint8

const (
	itemHeaders itemKind = iota
	itemData
	itemReset
)

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// release gives back the stream's body buffer.
func (st *stream) release() {
	if st.body != nil {
		*st.body = (*st.body)[:0]
		bodyPool.Put(st.body)
		st.body = nil
	}
}

// parseCheck reports whether the request head f is exactly a check, or a
// ShouldRateLimit call when rls is set (see the package doc), recording
// what the check core needs. Anything else goes to net/http, which
// decides what it is.
func (st *stream) parseCheck(f *http2.MetaHeadersFrame, rls bool) bool {
	var method, scheme, path, authority bool
	for _, hf := range f.PseudoFields() {
		switch hf.Name {
		case ":method":
			method = hf.Value == http.MethodPost
		case ":scheme":
			scheme = hf.Value == "http"
		case ":path":
			path = hf.Value == checkPath
			st.rls = rls && hf.Value == RLSPath
			path = path || st.rls
		case ":authority":
			authority = hf.Value != "" && !containsByte(hf.Value, '@')
		default:
			return false
		}
	}
	if !method || !scheme || !path || !authority {
		return false
	}
	var length, auth, te, grpc bool
	contentTypes := 0
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			contentTypes++
			grpc = IsGRPC(hf.Value)
		case "grpc-timeout":
			st.timeout = hf.Value
		case "content-length":
			n, err := strconv.ParseUint(hf.Value, 10, 63)
			if length || err != nil {
				return false
			}
			length, st.declLen = true, int64(n)
		case "authorization":
			if auth {
				return false
			}
			auth, st.auth = true, hf.Value
		case "x-request-id":
			// The first one, as net/http's Header.Get; an empty one is
			// none (the bridge makes one up).
			if !st.hasReqID {
				st.hasReqID, st.reqID = true, hf.Value
			}
		case "te":
			if te || hf.Value != "trailers" && hf.Value != "" {
				return false
			}
			te = true
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "expect", "trailer":
			return false
		}
	}
	if st.rls && (!grpc || contentTypes != 1) {
		return false // net/http's handler says what is wrong with it
	}
	if f.StreamEnded() {
		st.declLen = -1 // no body: net/http checks no length then
	}
	st.body = bodyPool.Get().(*[]byte)
	return true
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

// receiveBody adds DATA of a check to its body (mu held). Past MaxBody
// the check core answers at once, with net/http's error for it.
func (c *conn) receiveBody(st *stream, data []byte) {
	st.bodyLen += int64(len(data))
	if st.bodyLen > int64(c.s.o.MaxBody) {
		st.bodyErr = &http.MaxBytesError{Limit: int64(c.s.o.MaxBody)}
		c.dispatch(st)
	} else {
		*st.body = append(*st.body, data...)
	}
	// Consumed: the credit goes back as net/http's handler reading the
	// body would return it.
	c.sendWindowUpdate(nil, len(data))
	c.sendWindowUpdate(st, len(data))
}

// endRequest hands a complete check to the check core (mu held).
func (c *conn) endRequest(st *stream) {
	if st.declLen >= 0 && st.bodyLen != st.declLen {
		st.bodyErr = fmt.Errorf("request declared a Content-Length of %d but only wrote %d bytes", st.declLen, st.bodyLen)
	}
	st.state = stateHalfClosedRemote
	c.dispatch(st)
}

func (c *conn) dispatch(st *stream) {
	st.answering, st.running = true, true
	select {
	case c.s.work <- st:
	default:
		go c.s.worker(st)
	}
}

// workerIdle is how long a check goroutine waits for the next check before
// it ends. Goroutines that live on keep the stack a check grew them: a
// new goroutine per check spent a tenth of the bridge's CPU growing its
// stack.
const workerIdle = 10 * time.Second

// worker runs checks: st, then those handed to it while it waits.
func (s *Server) worker(st *stream) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		st.c.runCheck(st)
		idle.Reset(workerIdle)
		select {
		case st = <-s.work:
		case <-idle.C:
			return
		}
	}
}

var respPool = sync.Pool{New: func() any { return new(checkio.Response) }}

// runCheck has the check core answer st and queues the answer.
func (c *conn) runCheck(st *stream) {
	req := &st.req
	*req = checkio.Request{Body: *st.body, BodyErr: st.bodyErr}
	if st.auth != "" { // an empty one is none to the token check
		req.Authorization = unsafe.Slice(unsafe.StringData(st.auth), len(st.auth))
	}
	if st.hasReqID && st.reqID != "" {
		req.RequestID = unsafe.Slice(unsafe.StringData(st.reqID), len(st.reqID))
	}
	h := c.s.o.Handler
	if st.rls {
		h = c.s.o.RLS
		if st.timeout != "" {
			req.GRPCTimeout = unsafe.Slice(unsafe.StringData(st.timeout), len(st.timeout))
		}
	}
	resp := respPool.Get().(*checkio.Response)
	resp.Reset()
	h.ServeCheck(c.ctx, req, resp)
	*req = checkio.Request{}
	c.mu.Lock()
	st.running = false
	if st.closed || c.dead {
		st.release()
	} else {
		c.queueAnswer(st, resp)
	}
	c.mu.Unlock()
	respPool.Put(resp)
}
