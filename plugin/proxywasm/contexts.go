package proxywasm

// contexts maps context ids to their contexts. Every callback of a request
// looks its context up, and in Go compiled to WebAssembly a map operation
// costs about as much as the rest of a short callback (the hash runs in
// software), so ids are kept in an open-addressed table of their own:
// a multiply and a probe or two. Hosts number contexts from a counter, so
// Fibonacci hashing spreads consecutive ids over the table.
type contexts[T any] struct {
	slots []ctxSlot[T] // a power of two long; id 0 marks a free slot
	shift uint32       // 32 - log2(len(slots))
	mask  uint32       // len(slots) - 1
	n     int
}

type ctxSlot[T any] struct {
	id uint32
	v  T
}

// ctxMinSlots is the table's first size: room for the streams one worker
// usually has in flight without growing.
const ctxMinSlots = 64

func (c *contexts[T]) index(id uint32) uint32 {
	return (id * 0x9E3779B9) >> c.shift
}

// get returns the context of id, if there is one.
func (c *contexts[T]) get(id uint32) (v T, ok bool) {
	if p := c.ref(id); p != nil {
		return *p, true
	}
	return v, false
}

// ref returns where the context of id is kept, nil when there is none,
// valid until the next put or del. The callbacks every request makes use
// it rather than get: it is small enough to be inlined.
func (c *contexts[T]) ref(id uint32) *T {
	if id == 0 || c.n == 0 {
		return nil
	}
	for i := c.index(id); ; i = (i + 1) & c.mask {
		switch c.slots[i].id {
		case id:
			return &c.slots[i].v
		case 0:
			return nil
		}
	}
}

// put sets the context of id (never 0: hosts do not use it).
func (c *contexts[T]) put(id uint32, v T) {
	if id == 0 {
		return
	}
	if 2*(c.n+1) > len(c.slots) { // at most half full keeps probes short
		c.grow()
	}
	for i := c.index(id); ; i = (i + 1) & c.mask {
		switch c.slots[i].id {
		case id:
			c.slots[i].v = v
			return
		case 0:
			c.slots[i] = ctxSlot[T]{id, v}
			c.n++
			return
		}
	}
}

// del removes id, moving later entries of its probe run back so that no
// tombstones build up over millions of requests.
func (c *contexts[T]) del(id uint32) {
	if id == 0 || c.n == 0 {
		return
	}
	mask := c.mask
	i := c.index(id)
	for c.slots[i].id != id {
		if c.slots[i].id == 0 {
			return
		}
		i = (i + 1) & mask
	}
	var zero ctxSlot[T]
	for j := (i + 1) & mask; c.slots[j].id != 0; j = (j + 1) & mask {
		home := c.index(c.slots[j].id)
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			c.slots[i] = c.slots[j]
			i = j
		}
	}
	c.slots[i] = zero
	c.n--
}

func (c *contexts[T]) grow() {
	old := c.slots
	size := 2 * len(old)
	if size < ctxMinSlots {
		size = ctxMinSlots
	}
	c.slots, c.n, c.shift, c.mask = make([]ctxSlot[T], size), 0, 32, uint32(size-1)
	for n := size; n > 1; n >>= 1 {
		c.shift--
	}
	for _, s := range old {
		if s.id != 0 {
			c.put(s.id, s.v)
		}
	}
}

// len returns how many contexts the table holds.
func (c *contexts[T]) len() int { return c.n }

// clear empties the table.
func (c *contexts[T]) clear() { clear(c.slots); c.n = 0 }
