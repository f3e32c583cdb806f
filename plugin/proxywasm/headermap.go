package proxywasm

import (
	"encoding/binary"
	"errors"
)

// ErrMalformedMap reports a serialized header map that does not follow the
// ABI's layout.
var ErrMalformedMap = errors.New("proxywasm: malformed header map")

// AppendHeaderMap appends the ABI serialization of headers to dst: the pair
// count, then the key and value lengths, then each key and value followed by
// a NUL byte, all integers little-endian uint32. An empty map appends nothing.
func AppendHeaderMap(dst []byte, headers [][2]string) []byte {
	if len(headers) == 0 {
		return dst
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(headers)))
	for _, h := range headers {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(h[1])))
	}
	for _, h := range headers {
		dst = append(dst, h[0]...)
		dst = append(dst, 0)
		dst = append(dst, h[1]...)
		dst = append(dst, 0)
	}
	return dst
}

// VisitHeaderMap calls fn for each pair of a serialized map, in order, with
// views into b. It validates the whole layout before the first call, so fn
// never sees part of a malformed map.
func VisitHeaderMap(b []byte, fn func(name, value []byte)) error {
	n, err := checkHeaderMap(b)
	if err != nil || n == 0 {
		return err
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		k := data[:kl]
		v := data[kl+1 : kl+1+vl]
		data = data[kl+1+vl+1:]
		fn(k, v)
	}
	return nil
}

// ParseHeaderMap returns a copy of the pairs of a serialized map.
func ParseHeaderMap(b []byte) ([][2]string, error) {
	n, err := checkHeaderMap(b)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([][2]string, 0, n)
	_ = VisitHeaderMap(b, func(k, v []byte) { out = append(out, [2]string{string(k), string(v)}) })
	return out, nil
}

// checkHeaderMap validates b and returns its pair count. Empty input and a
// single zero byte are the two encodings of an empty map.
func checkHeaderMap(b []byte) (int, error) {
	if len(b) == 0 || (len(b) == 1 && b[0] == 0) {
		return 0, nil
	}
	if len(b) < 4 {
		return 0, ErrMalformedMap
	}
	n64 := uint64(binary.LittleEndian.Uint32(b))
	if n64 > uint64(len(b)-4)/8 {
		return 0, ErrMalformedMap
	}
	n := int(n64)
	sizes := b[4 : 4+8*n]
	rest := uint64(len(b) - 4 - 8*n)
	var need uint64
	for i := 0; i < n; i++ {
		need += uint64(binary.LittleEndian.Uint32(sizes[8*i:])) + 1
		need += uint64(binary.LittleEndian.Uint32(sizes[8*i+4:])) + 1
		if need > rest {
			return 0, ErrMalformedMap
		}
	}
	if need != rest {
		return 0, ErrMalformedMap
	}
	// The terminators must be NULs where the lengths say.
	data := b[4+8*n:]
	for i := 0; i < n; i++ {
		kl := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if data[kl] != 0 || data[kl+1+vl] != 0 {
			return 0, ErrMalformedMap
		}
		data = data[kl+1+vl+1:]
	}
	return n, nil
}

// HeaderMapView is a serialized header map as the host handed it out,
// validated once, for lookups that need no further host call. Its values
// are views, valid during the current callback only.
type HeaderMapView struct {
	b []byte
	n int
}

// NewHeaderMapView validates b.
func NewHeaderMapView(b []byte) (HeaderMapView, error) {
	n, err := checkHeaderMap(b)
	if err != nil {
		return HeaderMapView{}, err
	}
	return HeaderMapView{b: b, n: n}, nil
}

// Get returns the first value of name, compared exactly (the host gives
// lower-case names).
func (v HeaderMapView) Get(name string) ([]byte, bool) {
	if v.n == 0 {
		return nil, false
	}
	sizes := v.b[4 : 4+8*v.n]
	data := v.b[4+8*v.n:]
	for i := 0; i < v.n; i++ {
		kl := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if kl == len(name) && string(data[:kl]) == name {
			return data[kl+1 : kl+1+vl], true
		}
		data = data[kl+1+vl+1:]
	}
	return nil, false
}
