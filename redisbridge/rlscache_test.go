package redisbridge

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestOverLimitCache_Spent(t *testing.T) {
	var now atomic.Int64
	c := newOverLimitCache(2, now.Load)
	c.add("a", 5, 10*time.Second)
	c.add("b", 5, 20*time.Second)
	c.add("c", 5, 30*time.Second) // full: not taken
	now.Add(5_000)
	for _, tt := range []struct {
		key   string
		limit int64
		until time.Duration
		ok    bool
	}{
		{"a", 5, 5 * time.Second, true},
		{"a", 6, 0, false}, // spent at another limit
		{"b", 5, 15 * time.Second, true},
		{"c", 5, 0, false},
	} {
		if until, ok := c.spent(tt.key, tt.limit); until != tt.until || ok != tt.ok {
			t.Errorf("spent(%s, %d) = %v, %v; want %v, %v", tt.key, tt.limit, until, ok, tt.until, tt.ok)
		}
	}
	// a's window ends: it is no longer spent, and a full cache makes
	// room by dropping it.
	now.Add(5_000)
	if _, ok := c.spent("a", 5); ok {
		t.Error("a is spent after its window ended")
	}
	c.add("c", 5, 30*time.Second)
	if _, ok := c.spent("c", 5); !ok {
		t.Error("c was not taken in the room a left")
	}
	if _, ok := c.spent("b", 5); !ok {
		t.Error("b was dropped before its window ended")
	}
}
