package redistest

import (
	"net"
	"strconv"
	"testing"
)

func TestDo_Replies(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct {
		args []string
		want any
	}{
		{[]string{"SET", "k", "v"}, "OK"},
		{[]string{"GET", "k"}, "v"},
		{[]string{"GET", "missing"}, nil},
		{[]string{"INCR", "n"}, "1"},
	} {
		got, err := Do(s.Addr, opTimeout, tc.args...)
		if err != nil || got != tc.want {
			t.Errorf("%v: %v %v, want %v", tc.args, got, err, tc.want)
		}
	}
	if _, err := Do(s.Addr, opTimeout, "INCR", "k"); err == nil {
		t.Error("INCR on a string: no error")
	}
	if v, err := Do(s.Addr, opTimeout, "KEYS", "*"); err != nil || len(v.([]any)) != 2 {
		t.Errorf("KEYS: %v %v", v, err)
	}
}

// A cluster node whose bus port is taken between the pick and its start
// (by another process, in a busy test run) starts on another port.
func TestServer_StartFirstPortTaken(t *testing.T) {
	s := newServer(t, []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"})
	taken := s.Addr
	bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port+10000)))
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	s.startFirst()
	t.Cleanup(s.Stop)
	if s.Addr == taken {
		t.Fatalf("started on %s, whose bus port is taken", taken)
	}
	if err := ping(s.Addr); err != nil {
		t.Fatalf("on %s: %v", s.Addr, err)
	}
}
