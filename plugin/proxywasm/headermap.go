package proxywasm

import (
	"encoding/binary"
	"unsafe"

	"github.com/sluicehq/sluice/internal/pwmap"
)

// ErrMalformedMap reports a serialized header map that does not follow the
// ABI's layout.
var ErrMalformedMap = pwmap.ErrMalformed

// AppendHeaderMap appends the ABI serialization of headers to dst: the pair
// count, then the key and value lengths, then each key and value followed by
// a NUL byte, all integers little-endian uint32. An empty map appends nothing.
func AppendHeaderMap(dst []byte, headers [][2]string) []byte { return pwmap.Append(dst, headers) }

// VisitHeaderMap calls fn for each pair of a serialized map, in order, with
// views into b. It validates the whole layout before the first call, so fn
// never sees part of a malformed map.
func VisitHeaderMap(b []byte, fn func(name, value []byte)) error { return pwmap.Visit(b, fn) }

// ParseHeaderMap returns a copy of the pairs of a serialized map.
func ParseHeaderMap(b []byte) ([][2]string, error) { return pwmap.Pairs(b) }

// HeaderMapView is a serialized header map as the host handed it out,
// validated and indexed in one pass, for lookups that need no further host
// call. Its names and values are views, valid during the current callback
// only. A request looks up half a dozen headers, and in Go compiled to
// WebAssembly every instruction of a loop is dear: walking the serialized
// sizes for each lookup cost more than the lookups, so a lookup scans one
// word per header, the name's length and last byte, and compares a name
// only when that word matches. The pseudo-headers every request reads
// come from one scan of those words (Pseudo).
type HeaderMapView struct {
	data []byte
	tags []uint64    // per pair: headerTag of its name
	ents []headerEnt // per pair: where it is in data
}

// headerEnt locates a pair in data. Offsets rather than strings: storing
// them costs no write barrier.
type headerEnt struct {
	name, nameLen, value, valueLen uint32
}

func headerTag(n uint64, last byte) uint64 { return n<<8 | uint64(last) }

// The tags of the pseudo-headers Pseudo returns.
const (
	tagMethod    = 7<<8 | 'd'
	tagPath      = 5<<8 | 'h'
	tagAuthority = 10<<8 | 'y'
)

// Reset makes v the view of b, or of an empty map when b is malformed. The
// pass reads b through unsafe pointers: each access is within b by the
// checks before it, and the bounds checks Go would add cost as much as the
// rest of the loop in WebAssembly.
func (v *HeaderMapView) Reset(b []byte) error {
	v.data, v.tags, v.ents = nil, v.tags[:0], v.ents[:0]
	if len(b) == 0 || (len(b) == 1 && b[0] == 0) {
		return nil
	}
	if len(b) < 4 {
		return ErrMalformedMap
	}
	n64 := uint64(binary.LittleEndian.Uint32(b))
	if n64 > uint64(len(b)-4)/8 {
		return ErrMalformedMap
	}
	n := int(n64)
	if cap(v.ents) < n {
		v.ents, v.tags = make([]headerEnt, 0, n), make([]uint64, 0, n)
	}
	tags, ents := v.tags[:n], v.ents[:n]
	base := unsafe.Pointer(unsafe.SliceData(b))
	sp := unsafe.Add(base, 4) // the sizes: 8n bytes, within b by the check on n
	ents = ents[:len(tags)]   // no bounds check on ents[i] below
	off := uint64(4 + 8*n)
	end := uint64(len(b))
	for i := range tags {
		// A pair's two lengths in one load: Go compiled to WebAssembly
		// reads encoding/binary's integers a byte at a time. WebAssembly
		// memory, and the hosts the plugin's tests run on, are
		// little-endian.
		w := *(*uint64)(sp)
		sp = unsafe.Add(sp, 8)
		kl, vl := w&0xffffffff, w>>32
		// Each name and value is followed by a NUL; next <= end puts both
		// within b, and off >= 4 puts off+kl-1 there too.
		next := off + kl + vl + 2
		if next > end || *(*byte)(unsafe.Add(base, off+kl))|*(*byte)(unsafe.Add(base, next-1)) != 0 {
			return ErrMalformedMap
		}
		// The name's last byte, or for an empty name 0: the byte before
		// it is within b (off >= 4) and masked off, without a branch,
		// which costs a jump through Go's block dispatch in WebAssembly.
		last := uint64(*(*byte)(unsafe.Add(base, off+kl-1))) & -((kl | -kl) >> 63)
		tags[i] = headerTag(kl, byte(last))
		ents[i] = headerEnt{uint32(off), uint32(kl), uint32(off + kl + 1), uint32(vl)}
		off = next
	}
	if off != end {
		return ErrMalformedMap
	}
	v.data, v.tags, v.ents = b, tags, ents
	return nil
}

// Pseudo returns the first :method, :path and :authority, "" for one that
// is absent, as Get would, in one scan: hosts put them first.
func (v *HeaderMapView) Pseudo() (method, path, authority string) {
	var found [3]*headerEnt
	var seen uint32 // a bit per name found
	tags, base := v.tags, unsafe.Pointer(unsafe.SliceData(v.data))
	ents := v.ents[:len(tags)]
	for i, t := range tags {
		// Which of the three it is: the tag has the length and last byte,
		// the rest is compared a word at a time, within the name.
		var p uint32
		switch t {
		case tagMethod:
			name := unsafe.Add(base, ents[i].name)
			if *(*uint32)(name) != 0x74656d3a || *(*uint32)(unsafe.Add(name, 3)) != 0x646f6874 { // ":met", "thod"
				continue
			}
			p = 0
		case tagPath:
			if *(*uint32)(unsafe.Add(base, ents[i].name)) != 0x7461703a { // ":pat"
				continue
			}
			p = 1
		case tagAuthority:
			name := unsafe.Add(base, ents[i].name)
			if *(*uint64)(name) != 0x69726f687475613a || *(*uint32)(unsafe.Add(name, 6)) != 0x79746972 { // ":authori", "rity"
				continue
			}
			p = 2
		default:
			continue
		}
		if seen&(1<<p) == 0 {
			seen |= 1 << p
			found[p] = &ents[i]
			if seen == 7 {
				break
			}
		}
	}
	return v.value(found[0]), v.value(found[1]), v.value(found[2])
}

// value is e's value, "" for nil.
func (v *HeaderMapView) value(e *headerEnt) string {
	if e == nil || e.valueLen == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(v.data)), e.value)), e.valueLen)
}

// Get returns the first value of name, compared exactly (the host gives
// lower-case names).
func (v *HeaderMapView) Get(name string) (string, bool) {
	var last byte
	if len(name) > 0 {
		last = name[len(name)-1]
	}
	tag := headerTag(uint64(len(name)), last)
	for i, t := range v.tags {
		if t == tag {
			if e := &v.ents[i]; sameBytes(v.str(e.name, e.nameLen), name) {
				return v.str(e.value, e.valueLen), true
			}
		}
	}
	return "", false
}

// sameBytes compares two strings of the same length. Header names are
// short: up to 16 bytes it compares two overlapping words of each, inline,
// rather than call the runtime's comparison, a dear call in WebAssembly.
func sameBytes(a, b string) bool {
	n := len(a)
	if n < 8 || n > 16 {
		return a == b
	}
	pa, pb := unsafe.Pointer(unsafe.StringData(a)), unsafe.Pointer(unsafe.StringData(b))
	return *(*uint64)(pa) == *(*uint64)(pb) &&
		*(*uint64)(unsafe.Add(pa, n-8)) == *(*uint64)(unsafe.Add(pb, n-8))
}

// Len returns the number of pairs.
func (v *HeaderMapView) Len() int { return len(v.ents) }

// str views n bytes of the map at off as a string, without copying.
func (v *HeaderMapView) str(off, n uint32) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(&v.data[off], n)
}
