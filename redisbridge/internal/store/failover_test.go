package store

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// A killed Cluster master's slots move to its replica; the store must follow
// within seconds, not go-redis's 60 s state reload interval.
func TestRedis_ClusterFailoverFollowed(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	s, err := NewRedis(RedisOptions{URL: c.URL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const key = "rl:{u:failover}:x"
	check := func() error {
		req := rules.CheckRequest{Limits: []rules.LimitRequest{lim(key, spec(rules.FixedWindow, 1000, hour))}}
		var resp rules.CheckResponse
		return s.Check(context.Background(), time.Time{}, &req, &resp)
	}
	if err := check(); err != nil {
		t.Fatal(err)
	}
	old, err := c.KillMasterOf(key + ":fw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFailover(key+":fw", old, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	for check() != nil {
		if time.Since(promoted) > 20*time.Second { // go-redis alone would take up to 60 s
			t.Fatal("checks still fail 20 s after the replica took over")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("checks pass again %v after the promotion", time.Since(promoted).Round(time.Millisecond))
}
