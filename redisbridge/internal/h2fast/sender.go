package h2fast

import (
	"bytes"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// sender is one direction of a connection's framing, for the client
// connection (to the client) and for each relay leg (to net/http): the
// frames queued for its writer goroutine, the header encoder, and what the
// peer allows (its windows and frame size). Guarded by the client
// connection's mu.
type sender struct {
	out, spare []byte // frames to write; the writer's other buffer
	wfr        *http2.Framer
	henc       *hpack.Encoder
	hbuf       bytes.Buffer
	wake       chan struct{}
	sendWindow int32 // the peer's connection window
	initWindow int32 // its SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   uint32
	blocked    []*stream // streams waiting for a window
}

func (w *sender) init() {
	w.wake = make(chan struct{}, 1)
	w.wfr = http2.NewFramer(w, nil)
	w.henc = hpack.NewEncoder(&w.hbuf)
	w.sendWindow, w.initWindow, w.maxFrame = defaultWindow, defaultWindow, defaultMaxFrame
}

// Write queues what the Framer writes.
func (w *sender) Write(p []byte) (int, error) {
	w.out = append(w.out, p...)
	return len(p), nil
}

// kick wakes the writer.
func (w *sender) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// writeBlock writes the header block encoded in hbuf on stream id:
// HEADERS, then CONTINUATION frames when it is larger than the peer's
// frame size.
func (w *sender) writeBlock(id uint32, endStream bool) {
	block := w.hbuf.Bytes()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), int(w.maxFrame))
		frag := block[:n]
		block = block[n:]
		if first {
			_ = w.wfr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: endStream, EndHeaders: len(block) == 0})
			first = false
		} else {
			_ = w.wfr.WriteContinuation(id, len(block) == 0, frag)
		}
	}
	w.kick()
}

// send writes the queued item it of stream st, as far as the windows
// allow (*streamWindow is the stream's): a header block whole, DATA up to
// the windows. It returns the DATA bytes written and whether it is all
// out; when it is not, st waits in blocked for a window.
func (w *sender) send(st *stream, it *outItem, streamWindow *int32) (int, bool) {
	if it.kind == itemHeaders {
		w.hbuf.Reset()
		for _, f := range it.fields {
			_ = w.henc.WriteField(f)
		}
		w.writeBlock(st.id, it.end)
		return 0, true
	}
	sent := 0
	for {
		n := min(len(it.data), int(w.maxFrame), int(*streamWindow), int(w.sendWindow))
		if n <= 0 && len(it.data) > 0 {
			if indexOf(w.blocked, st) < 0 {
				w.blocked = append(w.blocked, st)
			}
			return sent, false
		}
		last := n == len(it.data)
		_ = w.wfr.WriteData(st.id, it.end && last, it.data[:n])
		*streamWindow -= int32(n)
		w.sendWindow -= int32(n)
		sent += n
		it.data = it.data[n:]
		w.kick()
		if last {
			return sent, true
		}
	}
}

// unblock removes st from the streams waiting for a window.
func (w *sender) unblock(st *stream) {
	if i := indexOf(w.blocked, st); i >= 0 {
		w.blocked = append(w.blocked[:i], w.blocked[i+1:]...)
	}
}

// writeLoop writes what is queued to dst as it comes, until dead (read
// under mu) is true. With yield it lets other goroutines run before it
// takes what is queued; taken, if set, runs then, under mu.
func (w *sender) writeLoop(mu *sync.Mutex, dst net.Conn, dead *bool, yield bool, taken func()) {
	for range w.wake {
		if yield {
			runtime.Gosched()
		}
		mu.Lock()
		buf := w.out
		w.out, w.spare = w.spare[:0], nil
		if taken != nil {
			taken()
		}
		stop := *dead
		mu.Unlock()
		if len(buf) > 0 && !stop {
			_ = dst.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := dst.Write(buf); err != nil {
				dst.Close() // its reader sees it and cleans up
			}
		}
		mu.Lock()
		w.spare = buf[:0]
		stop = *dead
		mu.Unlock()
		if stop {
			return
		}
	}
}

func indexOf(ss []*stream, st *stream) int {
	for i, s := range ss {
		if s == st {
			return i
		}
	}
	return -1
}
