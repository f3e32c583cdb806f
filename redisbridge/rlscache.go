package redisbridge

import (
	"sync"
	"time"
)

// overLimitCache remembers the rate limit service's counters that have
// nothing left, until their window ends (--rls-over-limit-cache): a call
// with one is refused without a store call. Under a flood of refused
// calls Redis sees none of them, and they are still refused while Redis
// is down. A fixed window's count only grows until the window ends, so an
// entry stays true; units a Cluster refund gives back are the exception,
// and the entry then refuses what could pass, never lets more through.
type overLimitCache struct {
	max int
	now func() int64 // ms; a monotonic clock unless a test injects one

	mu sync.Mutex
	m  map[string]overLimitEntry
}

// overLimitEntry is a counter with nothing left.
type overLimitEntry struct {
	limit int64 // the limit it was spent at: with another, it is not
	until int64 // when its window ends, on the cache's clock
}

// newOverLimitCache makes a cache of up to max counters on the clock
// now (unix ms; nil: the system's monotonic clock).
func newOverLimitCache(max int, now func() int64) *overLimitCache {
	if now == nil {
		t0 := time.Now()
		now = func() int64 { return t0.UnixMilli() + time.Since(t0).Milliseconds() }
	}
	return &overLimitCache{max: max, now: now, m: map[string]overLimitEntry{}}
}

// spent tells whether the counter key, at limit, has nothing left, and
// how long until its window ends.
func (c *overLimitCache) spent(key string, limit int64) (time.Duration, bool) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if !ok || e.limit != limit {
		return 0, false
	}
	left := e.until - c.now()
	if left <= 0 {
		return 0, false
	}
	return time.Duration(left) * time.Millisecond, true
}

// add remembers that the counter key, at limit, has nothing left for
// untilReset. A full cache drops the entries whose window ended, and
// takes none while it stays full.
func (c *overLimitCache) add(key string, limit int64, untilReset time.Duration) {
	now := c.now()
	e := overLimitEntry{limit: limit, until: now + untilReset.Milliseconds()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok && len(c.m) >= c.max {
		for k, old := range c.m {
			if old.until <= now {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.max {
			return
		}
	}
	c.m[key] = e
}
