//go:build long

package redistest

import (
	"testing"
	"time"
)

// TestLong_ClusterKillMaster and TestLong_SentinelFailover exercise the
// helpers' failovers (make test-long); the store's failover tests use them.
func TestLong_ClusterKillMaster(t *testing.T) {
	c := StartCluster(t, 3, 1)
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes", len(c.Nodes))
	}
	const key = "rl:{u:alice}:x"
	m, err := c.MasterOf(key)
	if err != nil {
		t.Fatal(err)
	}
	// Replication is asynchronous: without WAIT the kill may come before
	// the replica has the write, and the write is lost with the master.
	// WAIT waits for its own connection's writes, so both go on one.
	if r, err := DoAll(m.Addr, opTimeout, []string{"SET", key, "1"}, []string{"WAIT", "1", "1000"}); err != nil || r[1] != "1" {
		t.Fatalf("SET on the slot's master, then WAIT for the replica: %q %v", r, err)
	}
	start := time.Now()
	if _, err := c.KillMasterOf(key); err != nil {
		t.Fatal(err)
	}
	nm, err := c.WaitFailover(key, m, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("replica %s took over from %s in %v", nm.Addr, m.Addr, time.Since(start))
	if v, err := DoString(nm.Addr, opTimeout, "GET", key); err != nil || v != "1" {
		t.Errorf("GET on the new master: %q %v", v, err)
	}
}

func TestLong_SentinelFailover(t *testing.T) {
	st := StartSentinel(t)
	if a, err := st.MasterAddr(); err != nil || a != st.Master.Addr {
		t.Fatalf("master %q %v, want %s", a, err, st.Master.Addr)
	}
	start := time.Now()
	nm, err := st.Failover(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nm != st.Replica {
		t.Errorf("new master %s, want the replica %s", nm.Addr, st.Replica.Addr)
	}
	t.Logf("forced failover in %v", time.Since(start))

	// Kill the new master: the sentinels agree and promote the old one back.
	start = time.Now()
	nm.Stop()
	back, err := st.WaitMaster(nm.Addr, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if back != st.Master {
		t.Errorf("after the kill master is %s, want %s", back.Addr, st.Master.Addr)
	}
	t.Logf("failover after a kill in %v", time.Since(start))
}
