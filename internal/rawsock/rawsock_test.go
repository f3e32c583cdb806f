package rawsock_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/rawsock"
)

func TestWrap(t *testing.T) {
	client, _ := nettest.Pair(t)
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	uc, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	raw := runtime.GOOS == "linux"
	for _, tc := range []struct {
		name    string
		c       net.Conn
		wrapped bool
	}{
		{"tcp", client, raw},
		{"unix", uc, raw},
		{"pipe", p1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := rawsock.Wrap(tc.c)
			if got := w != tc.c; got != tc.wrapped {
				t.Fatalf("wrapped: %v, want %v", got, tc.wrapped)
			}
			if tc.wrapped {
				if _, ok := w.(syscall.Conn); !ok {
					t.Error("the wrapped connection has no SyscallConn")
				}
				if _, ok := w.(interface{ CloseWrite() error }); !ok {
					t.Error("the wrapped connection has no CloseWrite")
				}
			}
		})
	}
}

// outcome is what a Read or Write gave, as a caller tells errors apart.
type outcome struct {
	n                                  int
	data                               string
	eof, timeout, closed, reset, isNet bool
	op, msg                            string
}

func outcomeOf(n int, data []byte, err error) outcome {
	o := outcome{n: n, data: string(data), eof: err == io.EOF,
		timeout: errors.Is(err, os.ErrDeadlineExceeded), closed: errors.Is(err, net.ErrClosed),
		reset: errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)}
	var ne net.Error
	if errors.As(err, &ne) {
		o.isNet = true
		o.timeout = o.timeout && ne.Timeout()
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		o.op = oe.Op
	}
	if err != nil {
		o.msg = err.Error()
	}
	return o
}

// TestConn_AsNetConn runs each case on a plain TCP connection and on the
// same kind of connection wrapped, and wants the same outcome from both.
func TestConn_AsNetConn(t *testing.T) {
	for _, tc := range []struct {
		name string
		// run acts on c, whose peer is peer, and returns the outcome.
		run func(t *testing.T, c, peer net.Conn) outcome
	}{
		{"read what the peer wrote", func(t *testing.T, c, peer net.Conn) outcome {
			peer.Write([]byte("hello"))
			b := make([]byte, 16)
			n, err := io.ReadAtLeast(c, b, 5)
			return outcomeOf(n, b[:n], err)
		}},
		{"read into nothing", func(t *testing.T, c, peer net.Conn) outcome {
			n, err := c.Read(nil)
			return outcomeOf(n, nil, err)
		}},
		{"write nothing", func(t *testing.T, c, peer net.Conn) outcome {
			n, err := c.Write(nil)
			return outcomeOf(n, nil, err)
		}},
		{"end of stream", func(t *testing.T, c, peer net.Conn) outcome {
			peer.Write([]byte("x"))
			peer.Close()
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil {
				return outcomeOf(0, nil, err)
			}
			n, err := c.Read(make([]byte, 4))
			return outcomeOf(n, b, err)
		}},
		{"read deadline", func(t *testing.T, c, peer net.Conn) outcome {
			c.SetReadDeadline(time.Now().Add(-time.Second))
			n, err := c.Read(make([]byte, 4))
			return outcomeOf(n, nil, err)
		}},
		{"read deadline while waiting", func(t *testing.T, c, peer net.Conn) outcome {
			c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			n, err := c.Read(make([]byte, 4))
			return outcomeOf(n, nil, err)
		}},
		{"read after close", func(t *testing.T, c, peer net.Conn) outcome {
			c.Close()
			n, err := c.Read(make([]byte, 4))
			return outcomeOf(n, nil, err)
		}},
		{"write after close", func(t *testing.T, c, peer net.Conn) outcome {
			c.Close()
			n, err := c.Write([]byte("x"))
			return outcomeOf(n, nil, err)
		}},
		{"read a reset", func(t *testing.T, c, peer net.Conn) outcome {
			peer.(*net.TCPConn).SetLinger(0)
			peer.Close()
			n, err := c.Read(make([]byte, 4))
			return outcomeOf(n, nil, err)
		}},
		{"write deadline while the peer does not read", func(t *testing.T, c, peer net.Conn) outcome {
			b := make([]byte, 64<<20) // before the deadline: zeroing it takes a while
			c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Write(b)
			return outcomeOf(min(n, 1), nil, err) // how much fit varies
		}},
		{"close ends a read waiting or about to", func(t *testing.T, c, peer net.Conn) outcome {
			done := make(chan outcome)
			go func() {
				n, err := c.Read(make([]byte, 4))
				done <- outcomeOf(n, nil, err)
			}()
			c.Close()
			return <-done
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The message, with the connection's addresses named alike.
			run := func(c, peer net.Conn) outcome {
				o := tc.run(t, c, peer)
				o.msg = strings.NewReplacer(c.LocalAddr().String(), "local", c.RemoteAddr().String(), "remote").Replace(o.msg)
				return o
			}
			plainC, plainPeer := nettest.Pair(t)
			want := run(plainC, plainPeer)
			c, peer := nettest.Pair(t)
			got := run(rawsock.Wrap(c), peer)
			if got != want {
				t.Errorf("wrapped: %+v\nnet.Conn: %+v", got, want)
			}
		})
	}
}

// TestConn_WriteWaits writes more than the socket buffers take while the
// peer reads slowly, so that writes come back partial and wait for room,
// and reads in both directions at once.
func TestConn_WriteWaits(t *testing.T) {
	c, peer := nettest.Pair(t)
	w := rawsock.Wrap(c)
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	got := make(chan []byte)
	go func() {
		var buf bytes.Buffer
		b := make([]byte, 1000)
		for buf.Len() < len(data) {
			n, err := peer.Read(b)
			if err != nil {
				break
			}
			buf.Write(b[:n])
		}
		got <- buf.Bytes()
	}()
	echo := make(chan []byte)
	go func() { // the other direction at the same time
		b := make([]byte, 5)
		_, err := io.ReadFull(w, b)
		if err != nil {
			b = nil
		}
		echo <- b
	}()
	peer.Write([]byte("olleh"))
	n, err := w.Write(data)
	if err != nil || n != len(data) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if b := <-got; !bytes.Equal(b, data) {
		t.Errorf("the peer read %d bytes, not what was written", len(b))
	}
	if b := <-echo; string(b) != "olleh" {
		t.Errorf("read %q", b)
	}
}

func TestConn_NoAllocation(t *testing.T) {
	c, peer := nettest.Pair(t)
	w := rawsock.Wrap(c)
	b, msg := make([]byte, 64), []byte("ping")
	if n := testing.AllocsPerRun(200, func() {
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, b[:4]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(w, b[:4]); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a round trip", n)
	}
}

// BenchmarkConn_RoundTrip is one request and answer of a few bytes between
// two goroutines over loopback TCP, each end plain or wrapped.
func BenchmarkConn_RoundTrip(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		name := "net.Conn"
		if wrapped {
			name = "rawsock"
		}
		b.Run(name, func(b *testing.B) {
			c, s := nettest.Pair(b)
			if wrapped {
				c, s = rawsock.Wrap(c), rawsock.Wrap(s)
			}
			go func() {
				buf := make([]byte, 64)
				for {
					if _, err := io.ReadFull(s, buf[:4]); err != nil {
						return
					}
					if _, err := s.Write(buf[:4]); err != nil {
						return
					}
				}
			}()
			buf, msg := make([]byte, 64), []byte("ping")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf[:4]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
