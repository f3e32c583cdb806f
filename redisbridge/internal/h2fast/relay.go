package h2fast

import (
	"bytes"
	"net"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A relayed stream goes to net/http's HTTP/2 server over a connection of
// the client connection's own (a backLeg: an in-memory pipe handed to
// net/http, on which the relay is the client). The request's header
// fields go as the client sent them (encoded again: the client's header
// compression state includes the checks answered here), its DATA and
// trailers as they come, and the answer comes back the same way, so
// net/http decides the stream exactly as it would alone. Stream ids stay
// the client's: the streams a leg sees are a subsequence of the client's,
// still ascending. Each side's flow control is kept on its own: DATA moves
// on as the next side's window allows, and credit goes back to where it
// came from once it moved on, so the relay holds at most one window's
// worth per direction.
//
// A leg is made for the first relayed stream and ends when net/http ends
// it (its idle timeout, a shutdown: a GOAWAY); the next relayed stream
// gets a new one. Streams net/http's GOAWAY leaves out (it had not read
// them yet) are reset with REFUSED_STREAM, which tells the client it may
// send them again elsewhere; a leg made as the bridge shuts down may
// refuse all of its streams that way.

// relayState is a relayed stream's side toward net/http.
type relayState struct {
	sendWindow int32     // net/http's window for what we forward on the stream
	queue      []outItem // client DATA and trailers waiting for it
	inflow     inflow    // net/http's credit on the stream
	peerReset  bool      // net/http reset the stream: nothing to tell it
}

// backLeg is one connection to net/http. Guarded by its client
// connection's mu, but for the reader's Framer.
type backLeg struct {
	c   *conn
	pc  net.Conn
	rfr *http2.Framer
	sender
	inflow   inflow // net/http's connection credit for DATA to us
	draining bool   // net/http sent GOAWAY: no new streams here
	dead     bool
	streams  int
}

// relayLeg returns the leg new streams go to, making one if needed (mu
// held); nil when net/http cannot take one.
func (c *conn) relayLeg() *backLeg {
	if b := c.back; b != nil && !b.draining && !b.dead {
		return b
	}
	ours, theirs := net.Pipe()
	b := &backLeg{c: c, pc: ours}
	b.sender.init()
	b.inflow.init(defaultWindow)
	b.rfr = http2.NewFramer(nil, ours)
	b.rfr.ReadMetaHeaders = hpack.NewDecoder(headerTableSize, nil)
	b.out = append(b.out, http2.ClientPreface...)
	// No server push: what net/http sends are answers to our streams.
	_ = b.wfr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	c.back = b
	c.backs = append(c.backs, b)
	go b.writeLoop()
	go b.readLoop()
	handoff := &pipeConn{Conn: theirs, local: c.nc.LocalAddr(), remote: c.nc.RemoteAddr()}
	go func() {
		if c.s.o.Handoff == nil || !c.s.o.Handoff(handoff) {
			theirs.Close()
			ours.Close()
		}
	}()
	return b
}

// pipeConn is net/http's end of a leg: it has the client's addresses, so
// what net/http serves on it (logs, the audit log) names the client.
type pipeConn struct {
	net.Conn
	local, remote net.Addr
}

func (p *pipeConn) LocalAddr() net.Addr  { return p.local }
func (p *pipeConn) RemoteAddr() net.Addr { return p.remote }

func (b *backLeg) writeLoop() { b.sender.writeLoop(&b.c.mu, b.pc, &b.dead, false, nil) }

// close ends the leg; its reader cleans up.
func (b *backLeg) close() { b.pc.Close() }

// openStream sends st's request head to net/http (mu held).
func (b *backLeg) openStream(st *stream, f *http2.MetaHeadersFrame) {
	st.back = b
	b.streams++
	st.rs.sendWindow = b.initWindow
	st.rs.inflow.init(defaultWindow)
	b.send(st, &outItem{kind: itemHeaders, fields: f.Fields, end: f.StreamEnded()}, &st.rs.sendWindow)
}

// forwardData queues the client's DATA for net/http (mu held).
func (b *backLeg) forwardData(st *stream, data []byte, end bool) {
	st.rs.queue = append(st.rs.queue, outItem{kind: itemData, data: bytes.Clone(data), end: end})
	b.flush(st)
}

// forwardTrailers queues the client's trailers for net/http (mu held).
func (b *backLeg) forwardTrailers(st *stream, f *http2.MetaHeadersFrame) {
	st.rs.queue = append(st.rs.queue, outItem{kind: itemHeaders, fields: f.Fields, end: f.StreamEnded()})
	b.flush(st)
}

// flush sends what st has queued for net/http as its windows allow; the
// client gets the credit back for what went (mu held).
func (b *backLeg) flush(st *stream) {
	if b.dead {
		return
	}
	c := b.c
	for len(st.rs.queue) > 0 {
		n, done := b.send(st, &st.rs.queue[0], &st.rs.sendWindow)
		if n > 0 {
			c.sendWindowUpdate(nil, n)
			if !st.closed {
				c.sendWindowUpdate(st, n)
			}
		}
		if !done {
			return
		}
		st.rs.queue[0] = outItem{}
		st.rs.queue = st.rs.queue[1:]
	}
}

func (b *backLeg) flushBlocked() {
	waiting := b.blocked
	b.blocked = nil
	for _, st := range waiting {
		b.flush(st)
	}
}

// resetStream tells net/http a stream is gone (mu held).
func (b *backLeg) resetStream(st *stream, code http2.ErrCode) {
	if b.dead || st.rs.peerReset {
		return
	}
	st.rs.peerReset = true
	_ = b.wfr.WriteRSTStream(st.id, code)
	b.kick()
}

// forget drops a closed stream (mu held).
func (b *backLeg) forget(st *stream) {
	b.streams--
	b.unblock(st)
	// The client's credit for DATA still queued goes back to it.
	for _, it := range st.rs.queue {
		b.c.sendWindowUpdate(nil, len(it.data))
	}
	st.rs.queue = nil
	if b.draining && b.streams == 0 {
		b.close()
	}
}

// delivered returns net/http's credit for n bytes of its DATA the client
// was sent (mu held).
func (b *backLeg) delivered(st *stream, n int) {
	if b.dead || n == 0 {
		return
	}
	b.deliveredConn(n)
	if st.rs.peerReset {
		return
	}
	if send := st.rs.inflow.add(n); send > 0 {
		_ = b.wfr.WriteWindowUpdate(st.id, uint32(send))
		b.kick()
	}
}

// deliveredConn returns net/http's connection credit for n bytes (mu held).
func (b *backLeg) deliveredConn(n int) {
	if send := b.inflow.add(n); send > 0 && !b.dead {
		_ = b.wfr.WriteWindowUpdate(0, uint32(send))
		b.kick()
	}
}

// stream is the open client stream id relayed on b, or nil.
func (b *backLeg) stream(id uint32) *stream {
	if st := b.c.streams[id]; st != nil && st.back == b {
		return st
	}
	return nil
}

func (b *backLeg) readLoop() {
	c := b.c
	for {
		f, err := b.rfr.ReadFrame()
		c.mu.Lock()
		ok := err == nil && !b.dead && b.process(f)
		if !ok {
			b.fail()
		}
		c.mu.Unlock()
		if !ok {
			b.kick()
			return
		}
	}
}

// process handles a frame from net/http (mu held), false when the leg
// cannot go on.
func (b *backLeg) process(f http2.Frame) bool {
	c := b.c
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		if st := b.stream(f.StreamID); st != nil {
			st.out = append(st.out, outItem{kind: itemHeaders, fields: f.Fields, end: f.StreamEnded()})
			c.pushOut(st)
		}
	case *http2.DataFrame:
		st := b.stream(f.StreamID)
		if st == nil {
			// The client is gone from it: take and return the credit.
			if !b.inflow.take(f.Length) {
				return false
			}
			b.deliveredConn(int(f.Length))
			return true
		}
		if !takeInflows(&b.inflow, &st.rs.inflow, f.Length) {
			return false
		}
		if pad := int(f.Length) - len(f.Data()); pad > 0 {
			b.delivered(st, pad)
		}
		st.out = append(st.out, outItem{kind: itemData, data: bytes.Clone(f.Data()), end: f.StreamEnded()})
		c.pushOut(st)
	case *http2.RSTStreamFrame:
		if st := b.stream(f.StreamID); st != nil {
			st.rs.peerReset = true
			st.out = append(st.out, outItem{kind: itemReset, code: f.ErrCode})
			c.pushOut(st)
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return true
		}
		err := f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingInitialWindowSize:
				growth := int32(s.Val) - b.initWindow
				b.initWindow = int32(s.Val)
				for _, st := range c.streams {
					if st.back == b {
						addWindow(&st.rs.sendWindow, growth)
					}
				}
			case http2.SettingMaxFrameSize:
				b.maxFrame = s.Val
			case http2.SettingHeaderTableSize:
				b.henc.SetMaxDynamicTableSizeLimit(s.Val)
			}
			return nil
		})
		if err != nil {
			return false
		}
		_ = b.wfr.WriteSettingsAck()
		b.kick()
		b.flushBlocked()
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			addWindow(&b.sendWindow, int32(f.Increment))
		} else if st := b.stream(f.StreamID); st != nil {
			addWindow(&st.rs.sendWindow, int32(f.Increment))
		}
		b.flushBlocked()
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = b.wfr.WritePing(true, f.Data)
			b.kick()
		}
	case *http2.GoAwayFrame:
		b.draining = true
		if c.back == b {
			c.back = nil
		}
		if f.ErrCode != http2.ErrCodeNo {
			// What the client sent on its relayed streams made net/http
			// end the connection: it ends the client's, as it would.
			c.goAway(f.ErrCode)
			return false
		}
		for _, st := range c.streams {
			if st.back == b && st.id > f.LastStreamID {
				st.rs.peerReset = true
				c.resetStream(st.id, http2.ErrCodeRefusedStream)
			}
		}
		if b.streams == 0 {
			b.close()
		}
	case *http2.PushPromiseFrame:
		return false // we disabled push
	}
	return true
}

// fail ends the leg (mu held): its streams that are still open end with
// INTERNAL_ERROR for the client.
func (b *backLeg) fail() {
	if b.dead {
		return
	}
	b.dead = true
	c := b.c
	if c.back == b {
		c.back = nil
	}
	if i := indexOfLeg(c.backs, b); i >= 0 {
		c.backs = append(c.backs[:i], c.backs[i+1:]...)
	}
	for _, st := range c.streams {
		if st.back == b {
			st.rs.peerReset = true
			c.resetStream(st.id, http2.ErrCodeInternal)
		}
	}
	b.pc.Close()
}

func indexOfLeg(bs []*backLeg, b *backLeg) int {
	for i, x := range bs {
		if x == b {
			return i
		}
	}
	return -1
}
