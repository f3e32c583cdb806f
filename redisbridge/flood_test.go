package redisbridge

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// flood sends one check per id in [from, to) through the bridge's handler,
// from 32 goroutines (so that the Redis store fills its pipelines), each
// check with one limit per algorithm (and a penalty on the fixed window),
// and fails the test on any answer but 200. Every again-th id is sent
// twice, so that its second check denies and writes the penalty's
// violation and block keys too (again 0: never).
func flood(t *testing.T, s *Server, from, to int, windowMS int64, again int) {
	t.Helper()
	pen := &rules.Penalty{Enabled: true, DetectionWindowMS: 2 * windowMS, ViolationThreshold: 1, Multipliers: []int64{1, 2}}
	const workers = 32
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from + w; i < to; i += workers {
				id := "flood-" + strconv.Itoa(i)
				spec := func(a rules.Algorithm) rules.LimitSpec {
					return rules.LimitSpec{Algorithm: a, Limit: 1, WindowMS: windowMS, Burst: 1, Cost: 1}
				}
				fw := spec(rules.FixedWindow)
				fw.Penalty = pen
				body := string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{RequestID: id, User: id, Endpoint: "/flood", Limits: []rules.LimitRequest{
					{Key: "rl:{u:" + id + "}:tb", Rule: "tb", Spec: spec(rules.TokenBucket)},
					{Key: "rl:{u:" + id + "}:sw", Rule: "sw", Spec: spec(rules.SlidingWindow)},
					{Key: "rl:{u:" + id + "}:sl", Rule: "sl", Spec: spec(rules.SlidingLog)},
					{Key: "rl:{u:" + id + "}:fw", Rule: "fw", Spec: fw},
				}}))
				checks := 1
				if again > 0 && i%again == 0 {
					checks = 2
				}
				for n := 0; n < checks; n++ {
					rec := httptest.NewRecorder()
					s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/rate-limit/check", strings.NewReader(body)))
					if rec.Code != http.StatusOK {
						select {
						case errs <- fmt.Sprintf("%s check %d: %d %s", id, n+1, rec.Code, rec.Body):
						default:
						}
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestFlood_MemoryStoreBounded: 2,500 distinct ids of 4 limits, 10,000
// distinct counter keys (and the penalty keys of every 10th id), against
// a memory store bounded at 1,000 keys. The store holds at most its bound
// and still decides new clients correctly. TestLong_FloodMemoryHeapFlat
// floods ten times as many and watches the heap.
func TestFlood_MemoryStoreBounded(t *testing.T) {
	set := testSettings()
	set.MemoryMaxKeys = 1_000
	s := startServer(t, set).Server
	mem := s.store.(*store.Memory)
	flood(t, s, 0, 1_250, 3_600_000, 10)
	halfKeys := mem.Len()
	flood(t, s, 1_250, 2_500, 3_600_000, 10)
	keys := mem.Len()
	if halfKeys > set.MemoryMaxKeys || keys > set.MemoryMaxKeys {
		t.Errorf("store holds %d then %d keys, bound %d", halfKeys, keys, set.MemoryMaxKeys)
	}
	if keys < set.MemoryMaxKeys/2 {
		t.Errorf("store holds only %d keys: the flood did not fill it", keys)
	}
	newClientStartsFull(t, s)
}

// newClientStartsFull: eviction does not confuse counters.
func newClientStartsFull(t *testing.T, s *Server) {
	t.Helper()
	body := checkBody(limit("rl:{u:after-flood}:x", rules.FixedWindow, 5))
	r := do(t, nil, "POST", startURL(t, s), body)
	var cr rules.CheckResponse
	if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || !cr.Allowed || cr.Decisions[0].Remaining != 4 {
		t.Errorf("a new client after the flood: %d %s", r.status, r.body)
	}
}

// TestFlood_RedisKeysExpire: every key the bridge writes for 2,000
// distinct ids (every algorithm, penalties included) carries a TTL.
// TestLong_FloodRedisMemoryBack floods 50,000 and waits for them to go.
func TestFlood_RedisKeysExpire(t *testing.T) {
	rs := redistest.Start(t)
	set := testSettings()
	set.Store, set.RedisURL = "redis", rs.URL
	set.RedisTimeout = 5 * time.Second // a loaded machine must not fail checks here
	s := startServer(t, set).Server
	c := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { c.Close() })
	const ids = 2_000
	flood(t, s, 0, ids, 3_600_000, 10)
	keys, noTTL, sample := scanTTLs(t, c)
	if noTTL > 0 {
		t.Errorf("%d of %d keys have no TTL, e.g. %q", noTTL, keys, sample)
	}
	if want := ids*4 + ids/10*2; keys != want {
		t.Errorf("%d keys after the flood, want %d (4 per id, and a violation and a block key per denied id)", keys, want)
	}
}

// startURL serves s's handler on a loopback test server.
func startURL(t *testing.T, s *Server) string {
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return hs.URL + "/v1/rate-limit/check"
}

// scanTTLs reads the TTL of every key: how many there are and how many
// have none (PTTL -1; -2 is a key that expired since SCAN saw it).
func scanTTLs(t *testing.T, c *redis.Client) (keys, noTTL int, sample []string) {
	ctx := context.Background()
	batch := make([]string, 0, 1000)
	flush := func() {
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range batch {
				p.PTTL(ctx, k)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, cmd := range cmds {
			keys++
			if cmd.(*redis.DurationCmd).Val() == -1 {
				noTTL++
				if len(sample) < 5 {
					sample = append(sample, batch[i])
				}
			}
		}
		batch = batch[:0]
	}
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == cap(batch) {
			flush()
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return keys, noTTL, sample
}
