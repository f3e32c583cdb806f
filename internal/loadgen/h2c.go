package loadgen

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The h2c client runs each connection on one goroutine, event by event:
// it reads what is buffered, and each answer that completes sends the
// next request into the write buffer, which goes out in one write before
// the next read would block. So a connection with many streams costs a
// read and a write per batch of answers, not per request, as a proxy's
// connection does.

// recvWindow is the window the client gives the server, per stream and
// for the connection; it is topped up as answers are read.
const recvWindow = 1 << 30

type h2stream struct {
	start  time.Time
	status int
	body   []byte
}

type h2conn struct {
	o     *Options
	c     net.Conn
	bw    *bufio.Writer
	br    *bufio.Reader
	fr    *http2.Framer
	enc   *hpack.Encoder
	hb    bytes.Buffer
	dec   *hpack.Decoder
	check func(int, []byte) error
	// contentType is the requests' (Options.ContentType, or JSON's).
	contentType string
	next        *atomic.Int64 // requests taken, over all connections
	stop        *atomic.Bool

	sendWindow int64 // the server's connection window for our bodies
	initWindow int64 // its per-stream window
	maxFrame   int
	unacked    int64 // DATA read, not yet given back
	nextID     uint32
	streams    map[uint32]*h2stream
	free       []*h2stream
	waiting    []int64 // requests waiting for the server's window
	lat        []time.Duration
	hdrStatus  int
	headersFor uint32
}

func runH2C(ctx context.Context, o Options) (Result, error) {
	if o.Streams <= 0 {
		o.Streams = 1
	}
	conns, err := dial(ctx, &o)
	if err != nil {
		return Result{}, err
	}
	var (
		next    atomic.Int64
		stop    atomic.Bool
		wg      sync.WaitGroup
		errOnce sync.Once
		firstEr error
		lat     = make([][]time.Duration, len(conns))
	)
	check := o.checker()
	cpu0 := processCPU()
	t0 := time.Now()
	for i, c := range conns {
		hc := &h2conn{o: &o, c: c, check: check, contentType: cmp.Or(o.ContentType, "application/json"), next: &next, stop: &stop, streams: map[uint32]*h2stream{},
			sendWindow: 65535, initWindow: 65535, maxFrame: 16384, nextID: 1}
		wg.Go(func() {
			defer c.Close()
			if err := hc.run(ctx); err != nil {
				errOnce.Do(func() { firstEr = err })
				stop.Store(true)
				for _, c := range conns {
					c.SetDeadline(time.Unix(1, 0)) // the others stop too
				}
			}
			lat[i] = hc.lat
		})
	}
	wg.Wait()
	return result(ctx, t0, cpu0, lat, firstEr)
}

func (h *h2conn) run(ctx context.Context) error {
	h.bw = bufio.NewWriterSize(h.c, 64<<10)
	h.br = bufio.NewReaderSize(h.c, 64<<10)
	h.fr = http2.NewFramer(h.bw, h.br)
	h.fr.SetReuseFrames()
	h.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			h.hdrStatus, _ = strconv.Atoi(f.Value)
		}
	})
	h.enc = hpack.NewEncoder(&h.hb)
	h.bw.WriteString(http2.ClientPreface)
	h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	h.fr.WriteWindowUpdate(0, recvWindow-65535)
	for range h.o.Streams {
		if !h.send() {
			break
		}
	}
	var block []byte
	for len(h.streams) > 0 || len(h.waiting) > 0 {
		if ctx.Err() != nil || h.stop.Load() {
			return ctx.Err()
		}
		if h.br.Buffered() == 0 {
			if err := h.bw.Flush(); err != nil {
				return fmt.Errorf("loadgen: write: %w", err)
			}
		}
		f, err := h.fr.ReadFrame()
		if err != nil {
			return fmt.Errorf("loadgen: read: %w", err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			block = append(block[:0], f.HeaderBlockFragment()...)
			h.headersFor = f.StreamID
			if f.HeadersEnded() {
				if err := h.headers(block, f.StreamEnded()); err != nil {
					return err
				}
			}
		case *http2.ContinuationFrame:
			block = append(block, f.HeaderBlockFragment()...)
			if f.HeadersEnded() {
				if err := h.headers(block, false); err != nil {
					return err
				}
			}
		case *http2.DataFrame:
			st := h.streams[f.StreamID]
			if st == nil {
				return fmt.Errorf("loadgen: DATA on unknown stream %d", f.StreamID)
			}
			st.body = append(st.body, f.Data()...)
			h.unacked += int64(f.Length)
			if h.unacked > recvWindow/2 {
				h.fr.WriteWindowUpdate(0, uint32(h.unacked))
				h.unacked = 0
			}
			if f.StreamEnded() {
				if err := h.complete(f.StreamID); err != nil {
					return err
				}
			}
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			f.ForeachSetting(func(s http2.Setting) error {
				switch s.ID {
				case http2.SettingInitialWindowSize:
					h.initWindow = int64(s.Val)
				case http2.SettingMaxFrameSize:
					h.maxFrame = int(s.Val)
				}
				return nil
			})
			h.fr.WriteSettingsAck()
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				h.sendWindow += int64(f.Increment)
				for len(h.waiting) > 0 && h.fits(h.waiting[0]) {
					i := h.waiting[0]
					h.waiting = h.waiting[1:]
					h.write(i)
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			return fmt.Errorf("loadgen: stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.GoAwayFrame:
			return fmt.Errorf("loadgen: GOAWAY %v", f.ErrCode)
		}
	}
	return h.bw.Flush()
}

// headers takes a response head.
func (h *h2conn) headers(block []byte, end bool) error {
	h.hdrStatus = 0
	if _, err := h.dec.Write(block); err != nil {
		return fmt.Errorf("loadgen: header block: %w", err)
	}
	st := h.streams[h.headersFor]
	if st == nil {
		return fmt.Errorf("loadgen: HEADERS on unknown stream %d", h.headersFor)
	}
	if st.status == 0 {
		st.status = h.hdrStatus
	}
	if end {
		return h.complete(h.headersFor)
	}
	return nil
}

// complete judges an answer and sends the next request in its place.
func (h *h2conn) complete(id uint32) error {
	st := h.streams[id]
	delete(h.streams, id)
	h.lat = append(h.lat, time.Since(st.start))
	if err := h.check(st.status, st.body); err != nil {
		return err
	}
	st.body, st.status = st.body[:0], 0
	h.free = append(h.free, st)
	h.send()
	return nil
}

// send takes the next request, if any are left, and writes it or queues
// it for the server's window.
func (h *h2conn) send() bool {
	i := h.next.Add(1) - 1
	if i >= int64(h.o.N) || h.stop.Load() {
		return false
	}
	if len(h.waiting) > 0 || !h.fits(i) {
		h.waiting = append(h.waiting, i)
		return true
	}
	h.write(i)
	return true
}

func (h *h2conn) fits(i int64) bool {
	n := int64(len(h.o.Bodies[i%int64(len(h.o.Bodies))]))
	return n <= h.sendWindow && n <= h.initWindow
}

// write writes request i on a new stream.
func (h *h2conn) write(i int64) {
	body := h.o.Bodies[i%int64(len(h.o.Bodies))]
	id := h.nextID
	h.nextID += 2
	h.hb.Reset()
	h.field(":method", "POST")
	h.field(":scheme", "http")
	h.field(":authority", h.o.Addr)
	h.field(":path", h.o.Path)
	h.field("content-type", h.contentType)
	h.field("content-length", strconv.Itoa(len(body)))
	h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hb.Bytes(), EndHeaders: true})
	for len(body) > h.maxFrame {
		h.fr.WriteData(id, false, body[:h.maxFrame])
		body = body[h.maxFrame:]
	}
	h.fr.WriteData(id, true, body)
	h.sendWindow -= int64(len(h.o.Bodies[i%int64(len(h.o.Bodies))]))
	var st *h2stream
	if n := len(h.free); n > 0 {
		st, h.free = h.free[n-1], h.free[:n-1]
	} else {
		st = &h2stream{}
	}
	st.start = time.Now()
	h.streams[id] = st
}

func (h *h2conn) field(name, value string) {
	_ = h.enc.WriteField(hpack.HeaderField{Name: name, Value: value})
}
