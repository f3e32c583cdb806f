// Package idmap is a map from the uint32 ids a proxy-wasm host hands out
// (context ids, call-out tokens) to values, for code compiled to
// WebAssembly. There a Go map operation costs about as much as the rest
// of a short callback (the hash runs in software), so ids are kept in an
// open-addressed table of their own: a multiply and a probe or two. Hosts
// number contexts and call-outs from counters, so Fibonacci hashing
// spreads consecutive ids over the table.
package idmap

// Map maps ids to values of type T. The zero Map is empty and ready for
// use.
type Map[T any] struct {
	slots []slot[T] // a power of two long
	shift uint32    // 32 - log2(len(slots))
	mask  uint32    // len(slots) - 1
	n     int
}

// slot holds id as key, id+1: 0 marks a free slot, and id 0 is held as
// any other (Envoy's context ids reach it when their counter wraps).
// Values hold pointers, so the wider key costs no room.
type slot[T any] struct {
	key uint64
	v   T
}

func key(id uint32) uint64 { return uint64(id) + 1 }

// minSlots is the table's first size: room for the streams one plugin VM
// usually has in flight without growing.
const minSlots = 64

// index is id's home slot (Fibonacci hashing); Ref has it written out.
func (m *Map[T]) index(id uint32) uint32 {
	return (id * 0x9E3779B9) >> m.shift
}

// Get returns the value of id, if there is one.
func (m *Map[T]) Get(id uint32) (v T, ok bool) {
	if p := m.Ref(id); p != nil {
		v, ok = *p, true
	}
	return v, ok
}

// Ref returns where the value of id is kept, nil when there is none,
// valid until the next Put or Delete. It and the callbacks every request
// makes through it are small enough to be inlined.
func (m *Map[T]) Ref(id uint32) *T {
	if m.n == 0 {
		return nil
	}
	// index and key written out: as calls they would cost the inliner's
	// budget more than their bodies, and Ref's callers would no longer
	// be inlined themselves.
	for i := (id * 0x9E3779B9) >> m.shift; ; i = (i + 1) & m.mask {
		switch s := &m.slots[i]; s.key {
		case uint64(id) + 1:
			return &s.v
		case 0:
			return nil
		}
	}
}

// Put sets the value of id.
func (m *Map[T]) Put(id uint32, v T) {
	if 2*(m.n+1) > len(m.slots) { // at most half full keeps probes short
		m.grow()
	}
	k := key(id)
	for i := m.index(id); ; i = (i + 1) & m.mask {
		switch m.slots[i].key {
		case k:
			m.slots[i].v = v
			return
		case 0:
			m.slots[i] = slot[T]{k, v}
			m.n++
			return
		}
	}
}

// Delete removes id, moving later entries of its probe run back so that
// no tombstones build up over millions of requests.
func (m *Map[T]) Delete(id uint32) {
	if m.n == 0 {
		return
	}
	mask, k := m.mask, key(id)
	i := m.index(id)
	for m.slots[i].key != k {
		if m.slots[i].key == 0 {
			return
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; m.slots[j].key != 0; j = (j + 1) & mask {
		home := m.index(uint32(m.slots[j].key - 1))
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = slot[T]{}
	m.n--
}

func (m *Map[T]) grow() {
	old := m.slots
	size := max(2*len(old), minSlots)
	m.slots, m.n, m.shift, m.mask = make([]slot[T], size), 0, 32, uint32(size-1)
	for n := size; n > 1; n >>= 1 {
		m.shift--
	}
	for _, s := range old {
		if s.key != 0 {
			m.Put(uint32(s.key-1), s.v)
		}
	}
}

// Len returns how many ids the map holds.
func (m *Map[T]) Len() int { return m.n }

// Clear empties the map.
func (m *Map[T]) Clear() { clear(m.slots); m.n = 0 }
