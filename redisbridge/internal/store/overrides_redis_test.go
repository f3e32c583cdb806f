package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// TestRedisOverrides_ReachOtherBridges: an override put through one
// bridge's Redis backend is applied by another bridge on the same Redis,
// and one written by a bridge from before the algorithm field was named
// so ("strategy") is still read.
func TestRedisOverrides_ReachOtherBridges(t *testing.T) {
	srv := redistest.Start(t)
	newSet := func() *overrides.Set {
		s, err := NewRedis(RedisOptions{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		set := overrides.New(s.Overrides(10*time.Millisecond), nil)
		t.Cleanup(set.Close)
		<-set.Loaded()
		return set
	}
	a, b := newSet(), newSet()
	o := overrides.Override{User: "u1", Endpoint: "/e", Algorithm: rules.SlidingWindow, Limit: 9, WindowMS: 1000, UpdatedMS: 7}
	if _, had, err := a.Put(context.Background(), o); err != nil || had {
		t.Fatalf("Put: had=%v err=%v", had, err)
	}
	if got, ok := a.Get("u1", "/e"); !ok || got != o {
		t.Fatalf("the bridge that put it: %+v %v", got, ok)
	}
	deadline := time.Now().Add(5 * time.Second)
	for got, _ := b.Get("u1", "/e"); got != o; got, _ = b.Get("u1", "/e") {
		if time.Now().After(deadline) {
			t.Fatalf("the other bridge sees %+v, want %+v", got, o)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A third bridge reads both forms at start.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	old := `{"user_id":"u2","endpoint":"*","limit":3,"window_ms":60000,"updated_ms":1,"strategy":"token_bucket"}`
	if err := rc.HSet(context.Background(), overridesKey, overrideField("u2", "*"), old, "bad", "{").Err(); err != nil {
		t.Fatal(err)
	}
	c := newSet()
	if got, ok := c.Get("u2", "*"); !ok || got.Algorithm != rules.TokenBucket || got.Limit != 3 {
		t.Fatalf("override in the former layout: %+v %v", got, ok)
	}
	if got, ok := c.Get("u1", "/e"); !ok || got != o {
		t.Fatalf("a bridge started later: %+v %v", got, ok)
	}
	// One of calendar months keeps them.
	m := overrides.Override{User: "u3", Endpoint: "*", Algorithm: rules.FixedWindow, Limit: 5000, WindowMS: 3 * rules.MonthMS, Months: 3, UpdatedMS: 8}
	if _, _, err := c.Put(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	if got, ok := newSet().Get("u3", "*"); !ok || got != m {
		t.Fatalf("months read back: %+v %v, want %+v", got, ok, m)
	}
	// A delete reaches the other bridges the same way.
	if prev, had, err := c.Delete(context.Background(), "u1", "/e"); err != nil || !had || prev != o {
		t.Fatalf("Delete: %+v %v %v", prev, had, err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for _, ok := a.Get("u1", "/e"); ok; _, ok = a.Get("u1", "/e") {
		if time.Now().After(deadline) {
			t.Fatal("the other bridge still applies the deleted override")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
