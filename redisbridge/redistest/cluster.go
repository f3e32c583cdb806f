package redistest

import (
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a running Redis Cluster of loopback redis-servers.
type Cluster struct {
	Nodes []*Server // masters first as created; roles change on failover
	URL   string    // redis+cluster://addr1,addr2,... (every node a seed)

	t testing.TB
}

// opTimeout bounds one probe command.
const opTimeout = time.Second

// StartCluster starts masters × (1 + replicasPerMaster) redis-servers in
// cluster mode (node timeout 1 s, so a dead master is replaced within a few
// seconds), joins them with redis-cli --cluster create, and waits until every
// node reports cluster_state:ok and every replica is in sync. They are killed
// when t ends.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, not %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli not found (apt-get install redis-tools): %v", err)
	}
	c := &Cluster{t: t}
	addrs := make([]string, 0, masters*(1+replicasPerMaster))
	for i := 0; i < masters*(1+replicasPerMaster); i++ {
		s := newServer(t, []string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000",
			// A replica that lost its master for a while may still take over:
			// in tests we want the failover, not the freshness check.
			"--cluster-replica-validity-factor", "0",
		})
		s.startFirst()
		t.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	c.URL = "redis+cluster://" + strings.Join(addrs, ",")
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// WaitOK waits until every running node reports cluster_state:ok, agrees
// on one owner per slot range, and every running replica's link to its
// master is up.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if last = c.healthy(); last == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ok within %v: %v", timeout, last)
}

func (c *Cluster) healthy() error {
	var view string
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		info, err := DoString(n.Addr, opTimeout, "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state not ok", n.Addr)
		}
		nodes, err := c.nodes(n.Addr)
		if err != nil {
			return err
		}
		var owners []string
		for _, e := range nodes {
			if e.master && !e.failed && len(e.slots) > 0 {
				owners = append(owners, fmt.Sprint(e.addr, e.slots))
			}
		}
		sort.Strings(owners) // CLUSTER NODES lists nodes in no fixed order
		v := strings.Join(owners, ";")
		if view == "" {
			view = v
		} else if v != view {
			return fmt.Errorf("%s: slot owners differ from another node's", n.Addr)
		}
		repl, err := DoString(n.Addr, opTimeout, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("%s: replica not in sync", n.Addr)
		}
	}
	return nil
}

type nodeEntry struct {
	addr   string
	master bool
	failed bool
	myself bool
	slots  [][2]int
}

// nodes reads CLUSTER NODES as seen by the node at addr.
func (c *Cluster) nodes(addr string) ([]nodeEntry, error) {
	text, err := DoString(addr, opTimeout, "CLUSTER", "NODES")
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
	}
	var out []nodeEntry
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		e := nodeEntry{addr: strings.SplitN(f[1], "@", 2)[0]}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				e.master = true
			case "fail", "fail?":
				e.failed = true
			case "myself":
				e.myself = true
			}
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if ok {
				b, _ = strconv.Atoi(hi)
			}
			e.slots = append(e.slots, [2]int{a, b})
		}
		out = append(out, e)
	}
	return out, nil
}

func (c *Cluster) anyRunning() (*Server, error) {
	for _, n := range c.Nodes {
		if n.Running() {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no cluster node is running")
}

// Slot returns the cluster slot of key, as the cluster computes it.
func (c *Cluster) Slot(key string) (int, error) {
	n, err := c.anyRunning()
	if err != nil {
		return 0, err
	}
	s, err := DoString(n.Addr, opTimeout, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(s)
}

// MasterOf returns the node that, in its own view, is the master serving
// key's slot.
func (c *Cluster) MasterOf(key string) (*Server, error) {
	slot, err := c.Slot(key)
	if err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		nodes, err := c.nodes(n.Addr)
		if err != nil {
			continue
		}
		for _, e := range nodes {
			if !e.myself || !e.master {
				continue
			}
			for _, r := range e.slots {
				if slot >= r[0] && slot <= r[1] {
					return n, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no running master serves slot %d", slot)
}

// KillMasterOf kills the master serving key's slot, as a crash would, and
// returns it.
func (c *Cluster) KillMasterOf(key string) (*Server, error) {
	m, err := c.MasterOf(key)
	if err != nil {
		return nil, err
	}
	m.Stop()
	return m, nil
}

// WaitFailover waits until a node other than old serves key's slot as
// master and the cluster is ok again, and returns the new master.
func (c *Cluster) WaitFailover(key string, old *Server, timeout time.Duration) (*Server, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m, err := c.MasterOf(key); err == nil && m != old {
			if err := c.WaitOK(time.Until(deadline)); err != nil {
				return nil, err
			}
			return m, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("no replica took over %q's slot within %v", key, timeout)
}
