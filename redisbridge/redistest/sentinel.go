package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// MasterName is the name the sentinels of StartSentinel monitor.
const MasterName = "mymaster"

// Sentinel is a running Sentinel deployment: a master, a replica and three
// sentinels, all on loopback.
type Sentinel struct {
	Master    *Server   // the master at start; roles swap on failover
	Replica   *Server   // its replica at start
	Sentinels []*Server // three sentinels, quorum 2
	URL       string    // redis+sentinel://s1,s2,s3/mymaster?db=0

	t testing.TB
}

// StartSentinel starts a master, a replica of it and three sentinels
// monitoring it (quorum 2, down-after 1 s, failover-timeout 3 s), and waits
// until the replica is in sync and every sentinel knows the replica and the
// other sentinels, so a failover can be agreed. All are killed when t ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	st := &Sentinel{t: t, Master: Start(t)}
	st.Replica = Start(t, "--replicaof", "127.0.0.1", portOf(st.Master))
	var addrs []string
	for i := 0; i < 3; i++ {
		s := newServer(t, nil)
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		conf := fmt.Sprintf(`port %s
bind 127.0.0.1
dir %s
logfile ""
loglevel warning
sentinel monitor %s 127.0.0.1 %s 2
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 3000
sentinel parallel-syncs %[3]s 1
`, portOf(s), s.dir, MasterName, portOf(st.Master))
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		s.startFirst()
		t.Cleanup(s.Stop)
		st.Sentinels = append(st.Sentinels, s)
		addrs = append(addrs, s.Addr)
	}
	st.URL = "redis+sentinel://" + strings.Join(addrs, ",") + "/" + MasterName + "?db=0"
	if err := st.waitReady(20 * time.Second); err != nil {
		t.Fatalf("redistest: sentinel: %v", err)
	}
	return st
}

func portOf(s *Server) string { return s.Addr[strings.LastIndexByte(s.Addr, ':')+1:] }

func (st *Sentinel) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = st.ready(); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not ready within %v: %v", timeout, last)
}

func (st *Sentinel) ready() error {
	repl, err := DoString(st.Replica.Addr, opTimeout, "INFO", "replication")
	if err != nil {
		return err
	}
	if !strings.Contains(repl, "master_link_status:up") {
		return fmt.Errorf("replica %s not in sync", st.Replica.Addr)
	}
	for _, s := range st.Sentinels {
		reps, err := Do(s.Addr, opTimeout, "SENTINEL", "REPLICAS", MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
		if l, _ := reps.([]any); len(l) < 1 {
			return fmt.Errorf("sentinel %s does not know the replica yet", s.Addr)
		}
		others, err := Do(s.Addr, opTimeout, "SENTINEL", "SENTINELS", MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
		if l, _ := others.([]any); len(l) < len(st.Sentinels)-1 {
			return fmt.Errorf("sentinel %s knows %d other sentinels", s.Addr, len(l))
		}
	}
	return nil
}

// MasterAddr returns the master address the first sentinel that answers
// reports.
func (st *Sentinel) MasterAddr() (string, error) {
	var last error
	for _, s := range st.Sentinels {
		v, err := Do(s.Addr, opTimeout, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil {
			last = err
			continue
		}
		if l, ok := v.([]any); ok && len(l) == 2 {
			return fmt.Sprintf("%v:%v", l[0], l[1]), nil
		}
		last = fmt.Errorf("sentinel %s: reply %v", s.Addr, v)
	}
	return "", last
}

// Failover asks a sentinel for a failover now (SENTINEL FAILOVER, no
// agreement needed) and waits until the old replica is master.
func (st *Sentinel) Failover(timeout time.Duration) (*Server, error) {
	old, err := st.MasterAddr()
	if err != nil {
		return nil, err
	}
	if _, err := DoString(st.Sentinels[0].Addr, opTimeout, "SENTINEL", "FAILOVER", MasterName); err != nil {
		return nil, fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	return st.WaitMaster(old, timeout)
}

// WaitMaster waits until the sentinels report a master other than old and
// that server says it is a master; it returns that server.
func (st *Sentinel) WaitMaster(old string, timeout time.Duration) (*Server, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		addr, err := st.MasterAddr()
		if err == nil && addr != old {
			for _, s := range []*Server{st.Master, st.Replica} {
				if s.Addr != addr {
					continue
				}
				role, err := Do(s.Addr, opTimeout, "ROLE")
				if l, ok := role.([]any); err == nil && ok && len(l) > 0 && l[0] == "master" {
					return s, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("no failover from %s within %v", old, timeout)
}
