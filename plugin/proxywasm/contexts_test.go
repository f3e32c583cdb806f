package proxywasm

import (
	"math/rand/v2"
	"testing"
)

// The table answers as a map would, whatever the order of puts and
// deletes, across growth and the wrap-around of probe runs.
func TestContexts_AgainstMap(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		var c contexts[int]
		want := map[uint32]int{}
		r := rand.New(rand.NewPCG(seed, seed))
		for step := 0; step < 200_000; step++ {
			// Ids from a counter, as hosts number contexts, in a window so
			// that deletes hit live ids; some random ids for collisions.
			id := uint32(step/4 - r.IntN(64))
			if r.IntN(8) == 0 {
				id = r.Uint32() & 0x3ff
			}
			switch r.IntN(3) {
			case 0, 1:
				c.put(id, step)
				if id != 0 {
					want[id] = step
				}
			case 2:
				c.del(id)
				delete(want, id)
			}
			if c.len() != len(want) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, c.len(), len(want))
			}
		}
		for id, v := range want {
			if got, ok := c.get(id); !ok || got != v {
				t.Fatalf("seed %d: get(%d) = %d, %v; want %d", seed, id, got, ok, v)
			}
		}
		n := 0
		for _, s := range c.slots {
			if s.id != 0 {
				n++
				if _, ok := want[s.id]; !ok {
					t.Fatalf("seed %d: id %d still held after delete", seed, s.id)
				}
			}
		}
		if n != len(want) {
			t.Fatalf("seed %d: %d slots used, want %d", seed, n, len(want))
		}
	}
}

func TestContexts_ZeroAndMissing(t *testing.T) {
	var c contexts[string]
	if _, ok := c.get(7); ok {
		t.Error("empty table found 7")
	}
	c.del(7) // no-op on an empty table
	c.put(0, "root?")
	if _, ok := c.get(0); ok || c.len() != 0 {
		t.Error("id 0 stored")
	}
	c.put(7, "a")
	c.put(7, "b")
	if v, ok := c.get(7); !ok || v != "b" || c.len() != 1 {
		t.Errorf("get(7) = %q, %v, len %d", v, ok, c.len())
	}
	c.del(8)
	if c.len() != 1 {
		t.Error("deleting a missing id changed the table")
	}
}

// The table stays the size the contexts in flight need: a million
// requests, 100 at a time, do not grow it past its first doubling.
func TestContexts_FlatOverChurn(t *testing.T) {
	var c contexts[int]
	for id := uint32(1); id <= 1_000_000; id++ {
		c.put(id, 0)
		if id > 100 {
			c.del(id - 100)
		}
	}
	if len(c.slots) > 256 || c.len() != 100 {
		t.Errorf("%d slots for %d contexts", len(c.slots), c.len())
	}
}

func BenchmarkContexts(b *testing.B) {
	var c contexts[stream]
	for i := 0; i < b.N; i++ {
		id := uint32(i + 1)
		c.put(id, stream{})
		c.get(id)
		c.get(id)
		c.del(id)
	}
}
