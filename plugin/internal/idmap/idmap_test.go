package idmap

import (
	"math/rand/v2"
	"testing"
)

// The table answers as a map would, whatever the order of puts and
// deletes, across growth and the wrap-around of probe runs, id 0
// included.
func TestMap_AgainstMap(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		var c Map[int]
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
				c.Put(id, step)
				want[id] = step
			case 2:
				c.Delete(id)
				delete(want, id)
			}
			if c.Len() != len(want) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, c.Len(), len(want))
			}
		}
		for id, v := range want {
			if got, ok := c.Get(id); !ok || got != v {
				t.Fatalf("seed %d: get(%d) = %d, %v; want %d", seed, id, got, ok, v)
			}
		}
		n := 0
		for _, s := range c.slots {
			if s.key != 0 {
				n++
				if _, ok := want[uint32(s.key-1)]; !ok {
					t.Fatalf("seed %d: id %d still held after delete", seed, s.key-1)
				}
			}
		}
		if n != len(want) {
			t.Fatalf("seed %d: %d slots used, want %d", seed, n, len(want))
		}
	}
}

func TestMap_ZeroAndMissing(t *testing.T) {
	var c Map[string]
	if _, ok := c.Get(7); ok {
		t.Error("empty table found 7")
	}
	if _, ok := c.Get(0); ok {
		t.Error("empty table found 0")
	}
	c.Delete(7) // no-op on an empty table
	c.Put(0, "zero")
	if v, ok := c.Get(0); !ok || v != "zero" || c.Len() != 1 {
		t.Errorf("get(0) = %q, %v, len %d", v, ok, c.Len())
	}
	c.Put(7, "a")
	c.Put(7, "b")
	if v, ok := c.Get(7); !ok || v != "b" || c.Len() != 2 {
		t.Errorf("get(7) = %q, %v, len %d", v, ok, c.Len())
	}
	c.Delete(8)
	if c.Len() != 2 {
		t.Error("deleting a missing id changed the table")
	}
	c.Delete(0)
	if _, ok := c.Get(0); ok || c.Len() != 1 {
		t.Errorf("0 still held after delete, len %d", c.Len())
	}
	c.Put(0, "again")
	c.Clear()
	if _, ok := c.Get(0); ok || c.Len() != 0 {
		t.Error("0 held after Clear")
	}
	if _, ok := c.Get(7); ok {
		t.Error("7 held after Clear")
	}
}

// The table stays the size the contexts in flight need: a million
// requests, 100 at a time, do not grow it past its first doubling.
func TestMap_FlatOverChurn(t *testing.T) {
	var c Map[int]
	for id := uint32(1); id <= 1_000_000; id++ {
		c.Put(id, 0)
		if id > 100 {
			c.Delete(id - 100)
		}
	}
	if len(c.slots) > 256 || c.Len() != 100 {
		t.Errorf("%d slots for %d contexts", len(c.slots), c.Len())
	}
}

func BenchmarkMap(b *testing.B) {
	var c Map[struct{ a, b any }]
	for i := 0; i < b.N; i++ {
		id := uint32(i + 1)
		c.Put(id, struct{ a, b any }{})
		c.Get(id)
		c.Get(id)
		c.Delete(id)
	}
}
