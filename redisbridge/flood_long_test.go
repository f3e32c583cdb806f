//go:build long

package redisbridge

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/redisbridge/redistest"
)

func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// TestLong_FloodMemoryHeapFlat: 25,000 distinct ids of 4 limits, 100,000
// distinct counter keys (and the penalty keys of every 10th id), against a
// memory store bounded at 10,000 keys. The store holds at most its bound,
// its heap stops growing, and it still decides new clients correctly.
func TestLong_FloodMemoryHeapFlat(t *testing.T) {
	set := testSettings()
	set.MemoryMaxKeys = 10_000
	set.Logger = nil
	s := startServer(t, set).Server
	mem := s.store.(*store.Memory)

	before := heapMiB()
	flood(t, s, 0, 12_500, 3_600_000, 10)
	half, halfKeys := heapMiB(), mem.Len()
	flood(t, s, 12_500, 25_000, 3_600_000, 10)
	end, keys := heapMiB(), mem.Len()
	t.Logf("memory store, --memory-max-keys 10000, 100000 distinct counter keys: %d keys held after 50000, %d after 100000; heap %.1f MiB before, %.1f after 50000 keys, %.1f after 100000",
		halfKeys, keys, before, half, end)
	if halfKeys > set.MemoryMaxKeys || keys > set.MemoryMaxKeys {
		t.Errorf("store holds %d then %d keys, bound %d", halfKeys, keys, set.MemoryMaxKeys)
	}
	if keys < set.MemoryMaxKeys/2 {
		t.Errorf("store holds only %d keys: the flood did not fill it", keys)
	}
	if end-half > 2 {
		t.Errorf("heap grew %.1f MiB over the second 50000 keys: the store is not bounded", end-half)
	}
	newClientStartsFull(t, s)
}

// TestLong_FloodRedisMemoryBack: every key the bridge writes for 50,000
// distinct ids (every algorithm, penalties included) carries a TTL; and
// with short windows, once they pass, Redis holds none of them and its
// used_memory is back where it started.
func TestLong_FloodRedisMemoryBack(t *testing.T) {
	rs := redistest.Start(t)
	set := testSettings()
	set.Store, set.RedisURL = "redis", rs.URL
	set.RedisTimeout = 5 * time.Second // a loaded machine must not fail checks here
	s := startServer(t, set).Server
	c := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()

	const ids = 50_000
	start := time.Now()
	flood(t, s, 0, ids, 3_600_000, 10)
	took := time.Since(start)
	keys, noTTL, sample := scanTTLs(t, c)
	t.Logf("redis: %d distinct ids of 4 limits (every 10th denied, with a penalty) in %v: %d keys, %d without a TTL",
		ids, took.Round(time.Millisecond), keys, noTTL)
	if noTTL > 0 {
		t.Errorf("%d of %d keys have no TTL, e.g. %q", noTTL, keys, sample)
	}
	if want := ids*4 + ids/10*2; keys != want {
		t.Errorf("%d keys after the flood, want %d (4 per id, and a violation and a block key per denied id)", keys, want)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// Short windows: the keys expire and take their memory with them.
	flood(t, s, 0, 100, 500, 10) // warm: connections open, scripts loaded
	waitEmpty(t, c, 10*time.Second)
	base := usedMemory(t, c)
	const shortIDs = 10_000
	flood(t, s, ids, ids+shortIDs, 500, 10)
	full := usedMemory(t, c)
	waitEmpty(t, c, 15*time.Second)
	after := usedMemory(t, c)
	t.Logf("redis: %d distinct ids with 500ms windows: used_memory %.2f MiB before, %.2f with their keys, %.2f once they expired",
		shortIDs, float64(base)/(1<<20), float64(full)/(1<<20), float64(after)/(1<<20))
	if full < base+1<<20 {
		t.Errorf("used_memory %d with the keys, %d before: the flood did not reach Redis", full, base)
	}
	if after > base+256<<10 {
		t.Errorf("used_memory %d once every key expired, %d before the flood", after, base)
	}
}

func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("INFO memory without used_memory")
	return 0
}

// waitEmpty waits until Redis holds no keys (their TTLs ran out).
func waitEmpty(t *testing.T, c *redis.Client, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n, err := c.DBSize(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left %v after the flood", n, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
