package h2fast

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
)

// netHTTP is net/http's HTTP/2 server behind a listener of handed-over
// connections, as the bridge runs it.
type netHTTP struct {
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
}

func startNetHTTP(t *testing.T, h http.Handler) *netHTTP {
	n := &netHTTP{srv: &http.Server{Handler: h, Protocols: new(http.Protocols), IdleTimeout: 2 * time.Minute},
		conns: make(chan net.Conn), done: make(chan struct{})}
	n.srv.Protocols.SetHTTP1(true)
	n.srv.Protocols.SetUnencryptedHTTP2(true)
	go n.srv.Serve(n)
	t.Cleanup(func() { n.srv.Close() })
	return n
}

func (n *netHTTP) Accept() (net.Conn, error) {
	select {
	case c := <-n.conns:
		return c, nil
	case <-n.done:
		return nil, net.ErrClosed
	}
}
func (n *netHTTP) Close() error {
	select {
	case <-n.done:
	default:
		close(n.done)
	}
	return nil
}
func (n *netHTTP) Addr() net.Addr { return &net.TCPAddr{} }
func (n *netHTTP) give(c net.Conn) bool {
	select {
	case n.conns <- c:
		return true
	case <-n.done:
		return false
	}
}

// echoCheck answers a check with its body and request id.
var echoCheck = checkio.HandlerFunc(func(_ context.Context, req *checkio.Request, resp *checkio.Response) {
	resp.Status = http.StatusOK
	resp.Set("Content-Type", "application/json")
	resp.Set("X-Request-Id", string(req.RequestID))
	resp.Body = append(resp.Body, req.Body...)
})

// serve runs an h2fast Server on a loopback listener.
func serve(t testing.TB, o Options) (*Server, string) {
	t.Helper()
	if o.Handler == nil {
		o.Handler = echoCheck
	}
	if o.MaxBody == 0 {
		o.MaxBody = 64 << 10
	}
	s := New(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { s.ServeConn(c, bufio.NewReader(c)) })
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		wg.Wait()
	})
	return s, ln.Addr().String()
}

// client is a raw HTTP/2 client connection.
type client struct {
	c   net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cl := &client{c: c, fr: http2.NewFramer(c, c)}
	cl.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	cl.enc = hpack.NewEncoder(&cl.hb)
	io.WriteString(c, http2.ClientPreface)
	return cl
}

func (cl *client) headers(id uint32, end bool, kv ...string) {
	cl.hb.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		cl.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	cl.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: cl.hb.Bytes(), EndStream: end, EndHeaders: true})
}

var checkReq = []string{":method", "POST", ":scheme", "http", ":path", "/v1/rate-limit/check", ":authority", "b"}

// settings reads the frames a server sends first: its SETTINGS, and the
// WINDOW_UPDATE that follows them.
func firstFrames(t *testing.T, cl *client) (settings []http2.Setting, window uint32) {
	t.Helper()
	cl.fr.WriteSettings()
	for window == 0 {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				f.ForeachSetting(func(s http2.Setting) error { settings = append(settings, s); return nil })
			}
		case *http2.WindowUpdateFrame:
			window = f.Increment
		}
	}
	return settings, window
}

// TestSettings_SameAsNetHTTP: a client is told the same settings and
// connection window by h2fast as by net/http's server.
func TestSettings_SameAsNetHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	defer srv.Close()
	_, addr := serve(t, Options{})
	wantS, wantW := firstFrames(t, dial(t, ln.Addr().String()))
	gotS, gotW := firstFrames(t, dial(t, addr))
	if !slices.Equal(gotS, wantS) || gotW != wantW {
		t.Fatalf("h2fast sends %v and a window update of %d; net/http %v and %d", gotS, gotW, wantS, wantW)
	}
}

// TestServer_AnswersChecksRelaysTheRest: a check is answered by the
// handler; another request on the same connection by net/http.
func TestServer_AnswersChecksRelaysTheRest(t *testing.T) {
	nh := startNetHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Seen", r.Method+" "+r.URL.Path+" "+string(b)+" "+r.RemoteAddr)
		w.WriteHeader(http.StatusTeapot)
	}))
	_, addr := serve(t, Options{Handoff: nh.give})
	cl := dial(t, addr)
	cl.fr.WriteSettings()
	cl.headers(1, false, append(checkReq, "x-request-id", "r1")...)
	cl.fr.WriteData(1, true, []byte(`{"limits":[]}`))
	cl.headers(3, false, ":method", "PUT", ":scheme", "http", ":path", "/other", ":authority", "b")
	cl.fr.WriteData(3, true, []byte("body"))
	// Until both answers ended: one's body may come after the other's
	// headers.
	got, ended := map[uint32]string{}, map[uint32]bool{}
	for len(ended) < 2 {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == ":status" || hf.Name == "x-seen" || hf.Name == "x-request-id" {
					got[f.StreamID] += hf.Name + "=" + hf.Value + " "
				}
			}
			if f.StreamEnded() {
				got[f.StreamID] += "end"
				ended[f.StreamID] = true
			}
		case *http2.DataFrame:
			got[f.StreamID] += string(f.Data())
			if f.StreamEnded() {
				ended[f.StreamID] = true
			}
		}
	}
	local := cl.c.LocalAddr().String()
	if got[1] != `:status=200 x-request-id=r1 {"limits":[]}` || got[3] != ":status=418 x-seen=PUT /other body "+local+" end" {
		t.Fatalf("answers %v", got)
	}
}

// TestServer_IdleTimeout: a connection without streams gets a GOAWAY
// after the idle timeout, and is closed.
func TestServer_IdleTimeout(t *testing.T) {
	_, addr := serve(t, Options{IdleTimeout: 20 * time.Millisecond})
	cl := dial(t, addr)
	cl.fr.WriteSettings()
	for {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			t.Fatalf("closed without GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo {
				t.Fatalf("GOAWAY %v", g.ErrCode)
			}
			break
		}
	}
	if _, err := cl.fr.ReadFrame(); err == nil {
		t.Fatal("not closed after the GOAWAY")
	}
}

// TestServer_MaxAge: a connection past its age is shut down as RFC 9113
// advises: a GOAWAY naming the largest stream id and a PING, then, once
// the PING is answered, a GOAWAY naming the last stream, which is still
// answered; then the connection closes.
func TestServer_MaxAge(t *testing.T) {
	_, addr := serve(t, Options{IdleTimeout: time.Hour, MaxAge: time.Nanosecond})
	cl := dial(t, addr)
	cl.c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a server that never ages it fails rather than hangs
	cl.fr.WriteSettings()
	// Opened before the client reads the first GOAWAY, as a stream
	// racing it would be.
	cl.headers(1, false, checkReq...)
	cl.fr.WriteData(1, true, []byte("x"))
	var goAways []string
	var body []byte
	for {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goAways = append(goAways, fmt.Sprintf("%v last %d", f.ErrCode, f.LastStreamID))
		case *http2.PingFrame:
			if !f.IsAck() {
				cl.fr.WritePing(true, f.Data)
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
		}
	}
	if want := []string{"NO_ERROR last 2147483647", "NO_ERROR last 1"}; !slices.Equal(goAways, want) || string(body) != "x" {
		t.Fatalf("GOAWAYs %q, answer %q; want %q and the stream answered", goAways, body, want)
	}
}

// TestServer_ShutdownWaitsForStreams: Shutdown sends GOAWAY at once,
// answers the check in flight, then closes the connection.
func TestServer_ShutdownWaitsForStreams(t *testing.T) {
	s, addr := serve(t, Options{})
	cl := dial(t, addr)
	firstFrames(t, cl)
	cl.headers(1, false, checkReq...)
	cl.fr.WriteData(1, false, []byte("a"))
	ping := func() { // the server has seen everything sent so far
		cl.fr.WritePing(false, [8]byte{1})
		for {
			f, err := cl.fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				return
			}
		}
	}
	ping()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	for {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
				t.Fatalf("GOAWAY %v last %d", g.ErrCode, g.LastStreamID)
			}
			break
		}
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a stream open: %v", err)
	default:
	}
	cl.fr.WriteData(1, true, []byte("b"))
	var body []byte
	for {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			break
		}
		if d, ok := f.(*http2.DataFrame); ok {
			body = append(body, d.Data()...)
		}
	}
	if string(body) != "ab" {
		t.Fatalf("answer %q", body)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}

// TestServer_FlowControl: an answer waits for the client's window, and
// goes out as it grows.
func TestServer_FlowControl(t *testing.T) {
	_, addr := serve(t, Options{})
	cl := dial(t, addr)
	cl.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3})
	body := []byte("0123456789")
	cl.headers(1, false, checkReq...)
	cl.fr.WriteData(1, true, body)
	var got []byte
	for len(got) < len(body) {
		f, err := cl.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			if len(d.Data()) > 3 {
				t.Fatalf("%d bytes sent on a window of 3", len(d.Data()))
			}
			got = append(got, d.Data()...)
			cl.fr.WriteWindowUpdate(1, uint32(len(d.Data())))
		}
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("got %q", got)
	}
}

// BenchmarkServer_Checks: checks on one connection with 64 in flight, as
// a proxy's connection carries them, on an answer-at-once handler: the
// transport's own cost and allocations per check.
func BenchmarkServer_Checks(b *testing.B) {
	_, addr := serve(b, Options{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var wmu sync.Mutex
	bw := bufio.NewWriter(c)
	fr := http2.NewFramer(bw, bufio.NewReader(c))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	io.WriteString(bw, http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	fr.WriteWindowUpdate(0, 1<<30)
	body := bytes.Repeat([]byte("x"), 200)
	slots := make(chan struct{}, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; n < b.N; {
			f, err := fr.ReadFrame()
			if err != nil {
				b.Error(err)
				return
			}
			if d, ok := f.(*http2.DataFrame); ok && d.StreamEnded() {
				n++
				<-slots
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slots <- struct{}{}
		wmu.Lock()
		id := uint32(2*i + 1)
		hb.Reset()
		for j := 0; j+1 < len(checkReq); j += 2 {
			enc.WriteField(hpack.HeaderField{Name: checkReq[j], Value: checkReq[j+1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, body)
		if len(slots) == cap(slots) || i == b.N-1 {
			bw.Flush()
		}
		wmu.Unlock()
	}
	<-done
}
