package proxywasm

import "unsafe"

// arenaSize bounds what one callback can receive from the host without
// heap allocation. 64 KiB covers header maps and call-out bodies of a
// rate-limit decision many times over; larger requests fall back to make.
const arenaSize = 64 << 10

// arena serves proxy_on_memory_allocate. The host copies header values,
// properties and bodies into memory the guest allocates; serving that from a
// bump allocator that is reset after every top-level callback keeps the
// request path free of heap allocations. The arena and the fallback blocks
// stay referenced from here, so the GC never frees memory the host still
// writes or the callback still reads.
var arena struct {
	buf      []byte
	off      int
	overflow [][]byte // fallback blocks of this callback, kept alive until reset
	depth    int      // nesting of exported callbacks
	seq      uint64   // outermost callbacks entered so far
}

// CallbackSeq numbers the outermost callbacks: what the host handed out
// (views, HeaderMapView) is valid while it stays the same.
func CallbackSeq() uint64 { return arena.seq }

// allocate returns size bytes that stay valid until the outermost callback
// returns. It never returns nil or a zero-sized block: the host treats 0 as
// failure, and &b[0] of an empty slice would panic.
func allocate(size uint32) unsafe.Pointer {
	n := int(size)
	if n == 0 {
		n = 1
	}
	if arena.buf == nil {
		arena.buf = make([]byte, arenaSize)
	}
	if arena.off+n <= len(arena.buf) {
		p := unsafe.Pointer(&arena.buf[arena.off])
		arena.off += (n + 7) &^ 7 // keep blocks 8-byte aligned for the host's integer writes
		return p
	}
	b := make([]byte, n)
	arena.overflow = append(arena.overflow, b)
	return unsafe.Pointer(&b[0])
}

// enter and leave bracket every exported callback. When the outermost one
// leaves, everything allocated for the host since it entered is reclaimed.
func enter() {
	if arena.depth == 0 {
		arena.seq++
	}
	arena.depth++
}

func leave() {
	arena.depth--
	if arena.depth == 0 {
		arena.off = 0
		if len(arena.overflow) > 0 {
			clear(arena.overflow)
			arena.overflow = arena.overflow[:0]
		}
	}
}
