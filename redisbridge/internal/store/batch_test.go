package store

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// TestRedis_HotKeyOneCallPerBatch: checks of one key that queue while the
// pipeline waits for Redis are decided in one script call, which reads
// and writes the key once, with an exact answer for each: the limit is
// admitted, every remaining count from limit-1 down to 0 exactly once.
func TestRedis_HotKeyOneCallPerBatch(t *testing.T) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	for _, tc := range []struct {
		name       string
		viaGoRedis bool
	}{{"direct", false}, {"go-redis", true}} {
		t.Run(tc.name, func(t *testing.T) {
			// The pipeline holds its first batch until 49 more checks
			// queued behind it.
			var hold atomic.Pointer[chan struct{}]
			taken := make(chan struct{})
			s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 10 * time.Second, Pipelines: 1, viaGoRedis: tc.viaGoRedis,
				beforeExec: func([]*call) {
					if h := hold.Swap(nil); h != nil {
						taken <- struct{}{}
						<-*h
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			key := "rl:{u:hot-" + tc.name + "}:a"
			check := func() rules.CheckResponse {
				req := rules.CheckRequest{Limits: []rules.LimitRequest{lim(key, spec(rules.FixedWindow, 30, hour))}}
				var resp rules.CheckResponse
				if err := s.Check(ctx, time.Time{}, &req, &resp); err != nil {
					t.Error(err)
				}
				return resp
			}
			check() // connects and loads the script
			if err := rc.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			hold.Store(&release)
			answers := make([]rules.CheckResponse, 50)
			var wg sync.WaitGroup
			wg.Go(func() { answers[0] = check() })
			<-taken
			for i := 1; i < 50; i++ {
				wg.Go(func() { answers[i] = check() })
			}
			for len(s.in) != 49 {
				time.Sleep(time.Millisecond)
			}
			close(release)
			wg.Wait()
			var remaining []int64
			for _, a := range answers {
				if a.Allowed {
					remaining = append(remaining, a.Decisions[0].Remaining)
				}
			}
			slices.Sort(remaining)
			// The first check of this test took one unit.
			want := make([]int64, 29)
			for i := range want {
				want[i] = int64(i)
			}
			if !slices.Equal(remaining, want) {
				t.Fatalf("remaining counts of the admitted checks %v, want 0..28 once each", remaining)
			}
			stats, err := redistest.CommandStats(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			calls := map[string]int64{}
			for _, c := range []string{"evalsha", "eval", "time", "hmget", "hset", "pexpire"} {
				calls[c] = stats[c]
			}
			wantCalls := map[string]int64{"evalsha": 2, "eval": 0, "time": 2, "hmget": 2, "hset": 2, "pexpire": 2}
			if !maps.Equal(calls, wantCalls) {
				t.Fatalf("commands for 50 checks of one key in two batches: %v, want %v", calls, wantCalls)
			}
		})
	}
}

// TestRedis_FailedCheckFailsAlone: a check of a batch that fails in the
// script (its key holds another type) fails with the script's error; the
// checks before and after it in the same call are decided as usual.
func TestRedis_FailedCheckFailsAlone(t *testing.T) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := rc.Set(context.Background(), "rl:{u:bad}:x:fw", "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	good := []rules.LimitRequest{lim("rl:{u:good}:x", spec(rules.FixedWindow, 5, hour))}
	bad := []rules.LimitRequest{lim("rl:{u:good}:y", spec(rules.TokenBucket, 5, hour)), lim("rl:{u:bad}:x", spec(rules.FixedWindow, 5, hour))}
	cs := []*call{
		{scriptCall: scriptCall{mode: modeCheck, ls: good}, done: make(chan struct{}, 1)},
		{scriptCall: scriptCall{mode: modeCheck, ls: bad}, done: make(chan struct{}, 1)},
		{scriptCall: scriptCall{mode: modeCheck, ls: good}, done: make(chan struct{}, 1)},
	}
	decideInOneCall(s, cs)
	for i, want := range []int64{4, -1, 3} {
		resp := rules.CheckResponse{Decisions: make([]rules.Decision, len(cs[i].ls))}
		_, err := cs[i].result(&resp)
		if want < 0 {
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("check %d: %v, want the script's WRONGTYPE error", i, err)
			}
			continue
		}
		if err != nil || !resp.Allowed || resp.Decisions[0].Remaining != want {
			t.Fatalf("check %d: %+v %v, want allowed with %d remaining", i, resp, err, want)
		}
	}
	// The failed check consumed nothing: its token bucket was never written.
	if n := rc.Exists(context.Background(), "rl:{u:good}:y:tb").Val(); n != 0 {
		t.Fatal("the failed check wrote its other limit")
	}
}

// TestRedis_BatchPerSlot: on Redis Cluster a script's keys share one
// slot, so a pipeline's checks become one script call per slot, each
// keeping its checks' arrival order.
func TestRedis_BatchPerSlot(t *testing.T) {
	srv := redistest.Start(t)
	s, err := NewRedis(RedisOptions{URL: srv.URL, Timeout: 10 * time.Second, splitSlots: true, viaGoRedis: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var batch []*call
	for i, tag := range []string{"a", "b", "a", "c", "b", "a"} {
		ls := []rules.LimitRequest{lim("rl:{u:"+tag+"}:x", spec(rules.FixedWindow, 100, hour))}
		batch = append(batch, &call{scriptCall: scriptCall{mode: modeCheck, ls: ls}, deadline: time.Now().Add(time.Hour), vals: []int64{int64(i)}})
	}
	var gb groupBuf
	groups := s.groups(batch, &gb)
	var got [][]int64
	for _, g := range groups {
		var order []int64
		for _, c := range g {
			if Slot(c.limit(0).Key) != Slot(g[0].limit(0).Key) {
				t.Fatalf("a call mixes slots: %v and %v", c.limit(0).Key, g[0].limit(0).Key)
			}
			order = append(order, c.vals[0])
		}
		got = append(got, order)
	}
	// Sorted by slot; within a slot, arrival order.
	want := map[string][]int64{"a": {0, 2, 5}, "b": {1, 4}, "c": {3}}
	if len(got) != 3 {
		t.Fatalf("%d calls for 3 slots: %v", len(got), got)
	}
	for _, order := range got {
		tag := []string{"a", "b", "a", "c", "b", "a"}[order[0]]
		if !slices.Equal(order, want[tag]) {
			t.Fatalf("slot of {u:%s}: checks %v, want %v in arrival order", tag, order, want[tag])
		}
	}
	// And they are decided: every check answered.
	s.exec(groups, time.Now().Add(10*time.Second))
	for i, c := range batch {
		resp := rules.CheckResponse{Decisions: make([]rules.Decision, 1)}
		if _, err := c.readReply(c.vals, &resp); err != nil || c.err != nil || !resp.Allowed {
			t.Fatalf("check %d: %+v %v %v", i, resp, err, c.err)
		}
	}
}
