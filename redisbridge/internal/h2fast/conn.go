package h2fast

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

// streamState is where a stream stands, as net/http's server tracks it.
type streamState uint8

const (
	stateIdle streamState = iota
	stateOpen
	stateHalfClosedRemote // the client's request is complete
	stateClosed
)

// conn is one client connection. The reader goroutine (serve) reads and
// processes frames; checks run on goroutines of their own; a writer
// goroutine writes what the others queue. mu guards everything but the
// reader's own fields (br, rfr, sawSettings).
type conn struct {
	s           *Server
	nc          net.Conn
	br          *bufio.Reader
	rfr         *http2.Framer
	sawSettings bool
	ctx         context.Context // ends with the connection: the checks' context
	cancel      context.CancelFunc
	writerDone  chan struct{}

	mu sync.Mutex
	sender
	strs            map[string]string // header values the encoder may keep (intern)
	num             [20]byte
	dead            bool // the connection is closed: nothing more is queued
	queuedControl   int
	unackedSettings int
	inflow          inflow // the client's connection credit for DATA to us

	streams    map[uint32]*stream
	maxID      uint32 // highest stream id the client opened
	inGoAway   bool
	goAwayCode http2.ErrCode
	closeTimer *time.Timer
	idleTimer  *time.Timer
	ageTimer   *time.Timer // Options.MaxAge
	aging      bool        // onAged's first GOAWAY is sent

	back  *backLeg   // the relay to net/http that takes new streams, or nil
	backs []*backLeg // every relay leg open
}

func newConn(s *Server, nc net.Conn, r *bufio.Reader) *conn {
	c := &conn{s: s, nc: nc, br: r, writerDone: make(chan struct{}), streams: map[uint32]*stream{}}
	c.sender.init()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.rfr = http2.NewFramer(nil, r)
	c.rfr.ReadMetaHeaders = hpack.NewDecoder(headerTableSize, nil)
	c.rfr.MaxHeaderListSize = maxHeaderListSize
	c.rfr.SetMaxReadFrameSize(maxReadFrameSize)
	c.rfr.SetReuseFrames()
	c.inflow.init(connWindowSize)
	return c
}

// serve runs the connection: preface and settings, then frames until the
// connection ends.
func (c *conn) serve() {
	defer c.finish()
	// The preface and the first SETTINGS must come within settingsTimeout.
	_ = c.nc.SetReadDeadline(time.Now().Add(settingsTimeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		close(c.writerDone)
		return
	}
	go c.writeLoop()
	c.mu.Lock()
	_ = c.wfr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxReadFrameSize},
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: maxConcurrentStreams},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
		http2.Setting{ID: http2.SettingHeaderTableSize, Val: headerTableSize},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: initialWindowSize},
	)
	c.unackedSettings++
	_ = c.wfr.WriteWindowUpdate(0, connWindowSize-defaultWindow)
	c.idleTimer = time.AfterFunc(c.s.o.IdleTimeout, c.onIdle)
	if age := c.s.o.MaxAge; age > 0 {
		c.ageTimer = time.AfterFunc(checkio.ConnAge(age), c.onAged)
	}
	c.kick()
	c.mu.Unlock()
	for {
		f, err := c.rfr.ReadFrame()
		if !c.processFrameFromReader(f, err) {
			return
		}
	}
}

// finish tears the connection down once its reader is done.
func (c *conn) finish() {
	c.mu.Lock()
	c.dead = true
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	if c.ageTimer != nil {
		c.ageTimer.Stop() // the second GOAWAY's timer too, once onAged ran
	}
	if c.closeTimer != nil {
		c.closeTimer.Stop()
	}
	for _, st := range c.streams {
		st.closed = true
	}
	backs := c.backs
	c.backs, c.back = nil, nil
	c.mu.Unlock()
	c.kick()
	c.nc.Close()
	<-c.writerDone
	c.cancel()
	for _, b := range backs {
		b.close()
	}
}

// writeLoop writes what is queued, as it comes: checks answered while a
// write is under way go out together in the next.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	// Checks answered together (a Redis batch came back) queue their
	// answers one after the other: the writer yields to let them, and
	// writes them at once.
	c.sender.writeLoop(&c.mu, c.nc, &c.dead, true, func() { c.queuedControl = 0 })
}

// control counts a control frame queued; a client that makes us queue
// too many without reading them is cut off, as net/http does.
func (c *conn) control() {
	c.queuedControl++
	if c.queuedControl > maxQueuedControl {
		c.nc.Close()
	}
}

func (c *conn) onIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.goAway(http2.ErrCodeNo)
}

// agingPing is the payload of the PING onAged sends.
var agingPing = [8]byte{'s', 'l', 'u', 'i', 'c', 'e', '-', 'a'}

// onAged asks the client of a connection past its age (Options.MaxAge)
// to go elsewhere, as RFC 9113 section 6.8 advises for a graceful
// shutdown: a GOAWAY naming the largest stream id, which stops the
// client opening streams here, and a PING. Once the client answers the
// PING (it has seen the GOAWAY), or goAwayTimeout passed, goAway names
// the last stream it opened, and the connection closes after its
// streams. A stream the client opened before it saw the first GOAWAY is
// served, not refused: the proxy's check is not failed by the age.
func (c *conn) onAged() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.inGoAway || c.aging {
		return
	}
	c.aging = true
	_ = c.wfr.WriteGoAway(1<<31-1, http2.ErrCodeNo, nil)
	_ = c.wfr.WritePing(false, agingPing)
	c.kick()
	c.ageTimer = time.AfterFunc(goAwayTimeout, c.startGracefulShutdown)
}

// startGracefulShutdown is net/http's: a GOAWAY, then closing once the
// streams are done.
func (c *conn) startGracefulShutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.goAway(http2.ErrCodeNo)
}

// goAway sends a GOAWAY (mu held). After one with an error no stream
// frame is written any more; the connection closes goAwayTimeout after
// it, or, when graceful, after its last stream.
func (c *conn) goAway(code http2.ErrCode) {
	if c.dead {
		return
	}
	if c.inGoAway {
		if c.goAwayCode == http2.ErrCodeNo {
			c.goAwayCode = code
		}
		c.maybeClose()
		return
	}
	c.inGoAway, c.goAwayCode = true, code
	if code != http2.ErrCodeNo {
		// What is queued and not yet written is dropped: net/http writes
		// nothing but the GOAWAY once it hangs up on an error.
		c.out = c.out[:0]
	}
	_ = c.wfr.WriteGoAway(c.maxID, code, nil)
	c.kick()
	c.maybeClose()
}

func (c *conn) maybeClose() {
	if c.inGoAway && c.closeTimer == nil && (c.goAwayCode != http2.ErrCodeNo || len(c.streams) == 0) {
		c.closeTimer = time.AfterFunc(goAwayTimeout, func() { c.nc.Close() })
	}
}

// errored is whether a GOAWAY with an error was sent: no stream frames then.
func (c *conn) errored() bool { return c.inGoAway && c.goAwayCode != http2.ErrCodeNo }

// processFrameFromReader handles what the reader read, as net/http does.
// It reports whether to go on reading.
func (c *conn) processFrameFromReader(f http2.Frame, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		if !c.sawSettings {
			if _, ok := f.(*http2.SettingsFrame); !ok {
				err = http2.ConnectionError(http2.ErrCodeProtocol)
			} else {
				c.sawSettings = true
				_ = c.nc.SetReadDeadline(time.Time{})
			}
		}
		if err == nil {
			err = c.processFrame(f)
		}
		if err == nil {
			return true
		}
	} else {
		if errors.Is(err, http2.ErrFrameTooLarge) {
			c.goAway(http2.ErrCodeFrameSize)
			return true
		}
		if clientGone(err) {
			return false
		}
	}
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		c.resetStream(se.StreamID, se.Code)
		return true
	case errors.Is(err, errGoAwayFlow):
		c.goAway(http2.ErrCodeFlowControl)
		return true
	case errors.As(err, &ce):
		if f != nil && f.Header().StreamID > c.maxID {
			c.maxID = f.Header().StreamID
		}
		c.goAway(http2.ErrCode(ce))
		return true
	}
	return false
}

var errGoAwayFlow = errors.New("h2fast: connection flow control exceeded")

func clientGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ECONNRESET)
}

func streamError(id uint32, code http2.ErrCode) error {
	return http2.StreamError{StreamID: id, Code: code}
}

// state is a stream's state and the stream, when it is open.
func (c *conn) state(id uint32) (streamState, *stream) {
	if st := c.streams[id]; st != nil {
		return st.state, st
	}
	if id%2 == 1 && id <= c.maxID {
		return stateClosed, nil
	}
	return stateIdle, nil
}

func (c *conn) processFrame(f http2.Frame) error {
	// After a GOAWAY, frames of streams it did not cover, or all frames
	// after an error, are dropped, but their DATA still counts against
	// the connection window.
	if c.inGoAway && (c.goAwayCode != http2.ErrCodeNo || f.Header().StreamID > c.maxID) {
		if d, ok := f.(*http2.DataFrame); ok {
			if !c.inflow.take(d.Length) {
				return streamError(d.StreamID, http2.ErrCodeFlowControl)
			}
			c.sendWindowUpdate(nil, int(d.Length))
		}
		return nil
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		return c.processSettings(f)
	case *http2.MetaHeadersFrame:
		return c.processHeaders(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	case *http2.PingFrame:
		if f.IsAck() {
			if c.aging && f.Data == agingPing {
				c.goAway(http2.ErrCodeNo)
			}
			return nil // we send no other PING
		}
		_ = c.wfr.WritePing(true, f.Data)
		c.control()
		c.kick()
		return nil
	case *http2.DataFrame:
		return c.processData(f)
	case *http2.RSTStreamFrame:
		return c.processResetStream(f)
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return streamError(f.StreamID, http2.ErrCodeProtocol)
		}
		return nil
	case *http2.GoAwayFrame:
		c.goAway(http2.ErrCodeNo) // graceful, as net/http
		return nil
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	return nil // unknown frames are ignored
}

func (c *conn) processSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		c.unackedSettings--
		if c.unackedSettings < 0 {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		return nil
	}
	if f.NumSettings() > 100 || f.HasDuplicates() {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if err := f.ForeachSetting(c.processSetting); err != nil {
		return err
	}
	_ = c.wfr.WriteSettingsAck()
	c.control()
	c.kick()
	return nil
}

func (c *conn) processSetting(s http2.Setting) error {
	if err := s.Valid(); err != nil {
		return err
	}
	switch s.ID {
	case http2.SettingHeaderTableSize:
		c.henc.SetMaxDynamicTableSize(s.Val)
	case http2.SettingInitialWindowSize:
		growth := int32(s.Val) - c.initWindow
		c.initWindow = int32(s.Val)
		for _, st := range c.streams {
			if !addWindow(&st.sendWindow, growth) {
				return http2.ConnectionError(http2.ErrCodeFlowControl)
			}
		}
		c.flushBlocked()
	case http2.SettingMaxFrameSize:
		c.maxFrame = s.Val
	}
	return nil
}

// addWindow adds n to a send window, false if it would exceed 2^31-1.
func addWindow(w *int32, n int32) bool {
	sum := int64(*w) + int64(n)
	if sum > 1<<31-1 {
		return false
	}
	*w = int32(sum)
	return true
}

func (c *conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	if f.StreamID != 0 {
		state, st := c.state(f.StreamID)
		if state == stateIdle {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		if st == nil {
			return nil // half closed or closed: allowed
		}
		if !addWindow(&st.sendWindow, int32(f.Increment)) {
			return streamError(f.StreamID, http2.ErrCodeFlowControl)
		}
	} else if !addWindow(&c.sendWindow, int32(f.Increment)) {
		return errGoAwayFlow
	}
	c.flushBlocked()
	return nil
}

func (c *conn) processResetStream(f *http2.RSTStreamFrame) error {
	state, st := c.state(f.StreamID)
	if state == stateIdle {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if st != nil {
		if st.back != nil {
			st.back.resetStream(st, f.ErrCode)
		}
		c.closeStream(st)
	}
	return nil
}

// resetStream sends RST_STREAM and forgets the stream (mu held). net/http
// forgets it once the frame is written, which is at once (into its write
// buffer) unless that is full.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	if !c.errored() && !c.dead {
		_ = c.wfr.WriteRSTStream(id, code)
		c.control()
		c.kick()
	}
	if st := c.streams[id]; st != nil {
		if st.back != nil {
			st.back.resetStream(st, http2.ErrCodeCancel)
		}
		c.closeStream(st)
	}
}

func (c *conn) processData(f *http2.DataFrame) error {
	id := f.StreamID
	state, st := c.state(id)
	if id == 0 || state == stateIdle {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if st == nil || state != stateOpen || st.gotTrailer {
		// Not open for data: enforce and return the connection credit.
		if !c.inflow.take(f.Length) {
			return streamError(id, http2.ErrCodeFlowControl)
		}
		c.sendWindowUpdate(nil, int(f.Length))
		return streamError(id, http2.ErrCodeStreamClosed)
	}
	if st.answering {
		// Answered before its body ended (too large): the rest is
		// dropped, and a reset follows the answer.
		if !takeInflows(&c.inflow, &st.inflow, f.Length) {
			return streamError(id, http2.ErrCodeFlowControl)
		}
		c.sendWindowUpdate(nil, int(f.Length))
		return nil
	}
	data := f.Data()
	if st.back == nil && st.declLen >= 0 && st.bodyLen+int64(len(data)) > st.declLen {
		if !c.inflow.take(f.Length) {
			return streamError(id, http2.ErrCodeFlowControl)
		}
		c.sendWindowUpdate(nil, int(f.Length))
		return streamError(id, http2.ErrCodeProtocol)
	}
	if f.Length > 0 {
		if !takeInflows(&c.inflow, &st.inflow, f.Length) {
			return streamError(id, http2.ErrCodeFlowControl)
		}
		// Padding is returned at once, as net/http does.
		pad := int(f.Length) - len(data)
		c.sendWindowUpdate(nil, pad)
		c.sendWindowUpdate(st, pad)
		if st.back != nil {
			st.back.forwardData(st, data, f.StreamEnded())
			if f.StreamEnded() {
				st.state = stateHalfClosedRemote
				c.maybeDone(st)
			}
			return nil
		}
		c.receiveBody(st, data)
	} else if st.back != nil && f.StreamEnded() {
		st.back.forwardData(st, nil, true)
		st.state = stateHalfClosedRemote
		c.maybeDone(st)
		return nil
	}
	if f.StreamEnded() && !st.answering {
		c.endRequest(st)
	}
	return nil
}

// sendWindowUpdate returns n bytes of credit to the client, for the
// stream or (st nil) the connection, batched as net/http batches them.
func (c *conn) sendWindowUpdate(st *stream, n int) {
	if n <= 0 || c.dead {
		return
	}
	var id uint32
	var send int32
	if st == nil {
		send = c.inflow.add(n)
	} else {
		id, send = st.id, st.inflow.add(n)
	}
	if send > 0 && !c.errored() {
		_ = c.wfr.WriteWindowUpdate(id, uint32(send))
		c.kick()
	}
}

func (c *conn) processHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 != 1 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if st := c.streams[id]; st != nil {
		if st.state == stateHalfClosedRemote {
			return streamError(id, http2.ErrCodeStreamClosed)
		}
		return c.processTrailers(st, f)
	}
	if id <= c.maxID {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.maxID = id
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	if len(c.streams)+1 > maxConcurrentStreams {
		if c.unackedSettings == 0 {
			return streamError(id, http2.ErrCodeProtocol)
		}
		return streamError(id, http2.ErrCodeRefusedStream)
	}
	st := newStream(c, id)
	if f.StreamEnded() {
		st.state = stateHalfClosedRemote
	}
	c.streams[id] = st
	if f.HasPriority() && f.Priority.StreamDep == id {
		return streamError(id, http2.ErrCodeProtocol)
	}
	if f.Truncated {
		c.answerHeaderListTooLong(st)
		return nil
	}
	isCheck := st.parseCheck(f, c.s.o.RLS != nil) // a check's head is valid
	if !isCheck && !validHead(f) {
		return streamError(id, http2.ErrCodeProtocol)
	}
	if !isCheck {
		b := c.relayLeg()
		if b == nil {
			return streamError(id, http2.ErrCodeRefusedStream)
		}
		b.openStream(st, f)
		return nil
	}
	if f.StreamEnded() {
		c.endRequest(st)
	}
	return nil
}

// validHead reports whether net/http's server accepts a request head
// for its handler. It refuses the others itself, before it reads the
// next frame; decided here alike, so that the frames after such a head
// meet the same stream state.
func validHead(f *http2.MetaHeadersFrame) bool {
	method, scheme, path := f.PseudoValue("method"), f.PseudoValue("scheme"), f.PseudoValue("path")
	authority, protocol := f.PseudoValue("authority"), f.PseudoValue("protocol")
	if protocol != "" { // extended CONNECT is off
		return false
	}
	if method == http.MethodConnect {
		return path == "" && scheme == "" && authority != ""
	}
	if method == "" || path == "" || scheme != "https" && scheme != "http" {
		return false
	}
	if authority == "" {
		for _, hf := range f.RegularFields() {
			if hf.Name == "host" {
				authority = hf.Value
				break
			}
		}
	}
	if strings.IndexByte(authority, '@') >= 0 {
		return false
	}
	_, err := url.ParseRequestURI(path)
	return err == nil
}

// processTrailers handles a second header block on an open stream: a
// request's trailers.
func (c *conn) processTrailers(st *stream, f *http2.MetaHeadersFrame) error {
	if st.answering {
		return nil // net/http: a reset is on its way
	}
	if st.gotTrailer {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	st.gotTrailer = true
	if st.back != nil {
		// net/http judges the trailers.
		st.back.forwardTrailers(st, f)
		if f.StreamEnded() {
			st.state = stateHalfClosedRemote
			c.maybeDone(st)
		}
		return nil
	}
	if !f.StreamEnded() || len(f.PseudoFields()) > 0 {
		return streamError(st.id, http2.ErrCodeProtocol)
	}
	// A check declares no trailers (parseCheck): net/http drops them.
	c.endRequest(st)
	return nil
}

// closeStream forgets st (mu held).
func (c *conn) closeStream(st *stream) {
	if st.closed {
		return
	}
	st.closed = true
	st.state = stateClosed
	delete(c.streams, st.id)
	c.unblock(st)
	if st.back != nil {
		st.back.forget(st)
	}
	if !st.running {
		st.release()
	}
	if len(c.streams) == 0 {
		if c.idleTimer != nil && !c.dead {
			c.idleTimer.Reset(c.s.o.IdleTimeout)
		}
		c.maybeClose()
	}
}

// maybeDone closes a relayed stream once both sides ended it.
func (c *conn) maybeDone(st *stream) {
	if st.state == stateHalfClosedRemote && st.localEnded {
		c.closeStream(st)
	}
}
