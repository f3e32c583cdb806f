//go:build unix

package idleconn

import (
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/nettest"
)

// TestAlive: an idle connection is alive until its peer closes it or
// sends something unasked; probing it reads nothing, and a Probe kept
// for the connection probes it without allocating.
func TestAlive(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(net.Conn)
		want bool
	}{
		{"idle", func(net.Conn) {}, true},
		{"closed by the peer", func(c net.Conn) { c.Close() }, false},
		{"bytes unasked", func(c net.Conn) { c.Write([]byte("x")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, peer := nettest.Pair(t)
			tc.peer(peer)
			// What the peer did reaches this end within a moment.
			deadline := time.Now().Add(2 * time.Second)
			probe := NewProbe(c) // one probe, asked again and again
			got := Alive(c)
			for got != tc.want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				got = Alive(c)
			}
			if got != tc.want {
				t.Fatalf("Alive = %v, want %v", got, tc.want)
			}
			if got := probe.Alive(); got != tc.want {
				t.Fatalf("Probe.Alive = %v, want %v", got, tc.want)
			}
			if tc.want {
				if n := testing.AllocsPerRun(20, func() { probe.Alive() }); n != 0 {
					t.Errorf("Probe.Alive: %v allocations", n)
				}
			}
			if tc.want {
				// The probe consumed nothing: the connection still works.
				peer.Write([]byte("ok"))
				b := make([]byte, 2)
				if _, err := c.Read(b); err != nil || string(b) != "ok" {
					t.Fatalf("read after the probe: %q %v", b, err)
				}
			}
		})
	}
}
