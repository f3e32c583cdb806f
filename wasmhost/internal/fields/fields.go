// Package fields is the HTTP header map of the proxy-wasm host and its proxy-wasm
// serialization.
package fields

import (
	"encoding/binary"
	"errors"
	"strings"
)

// Map is an ordered multi-map with lower-case names, as Envoy keeps headers.
type Map [][2]string

// FromPairs copies pairs, lower-casing the names.
func FromPairs(pairs [][2]string) Map {
	m := make(Map, 0, len(pairs)+4)
	for _, p := range pairs {
		m = append(m, [2]string{strings.ToLower(p[0]), p[1]})
	}
	return m
}

// Get returns the first value of name.
func (m Map) Get(name string) (string, bool) {
	name = strings.ToLower(name)
	for _, p := range m {
		if p[0] == name {
			return p[1], true
		}
	}
	return "", false
}

// Add appends a value of name.
func (m *Map) Add(name, value string) { *m = append(*m, [2]string{strings.ToLower(name), value}) }

// Replace sets the first value of name and drops the others; adds it when absent.
func (m *Map) Replace(name, value string) {
	name = strings.ToLower(name)
	out := (*m)[:0]
	found := false
	for _, p := range *m {
		if p[0] == name {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	if !found {
		out = append(out, [2]string{name, value})
	}
	*m = out
}

// Remove drops every value of name.
func (m *Map) Remove(name string) {
	name = strings.ToLower(name)
	out := (*m)[:0]
	for _, p := range *m {
		if p[0] != name {
			out = append(out, p)
		}
	}
	clear((*m)[len(out):])
	*m = out
}

// Clone returns a copy that shares no backing array with m.
func (m Map) Clone() Map { return append(Map(nil), m...) }

// Append appends the proxy-wasm serialization of m to dst: the pair count,
// the key and value lengths, then every key and value NUL-terminated, all
// integers little-endian uint32.
func (m Map) Append(dst []byte) []byte {
	if len(m) == 0 {
		return dst
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m)))
	for _, p := range m {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[1])))
	}
	for _, p := range m {
		dst = append(append(dst, p[0]...), 0)
		dst = append(append(dst, p[1]...), 0)
	}
	return dst
}

// ErrMalformed reports a serialized map that breaks the layout.
var ErrMalformed = errors.New("malformed serialized header map")

// Parse decodes a serialized map that came from guest memory. Empty input
// and a single zero byte are both the empty map.
func Parse(b []byte) (Map, error) {
	n, err := layout(b)
	if err != nil || n == 0 {
		return nil, err
	}
	m := make(Map, 0, n)
	visit(b, n, func(k, v []byte) { m = append(m, [2]string{strings.ToLower(string(k)), string(v)}) })
	return m, nil
}

// Visit calls fn with each pair of a serialized map that came from guest
// memory, in order, as views into b, once the whole layout is checked: fn
// never sees part of a malformed map. Names are as the guest wrote them.
func Visit(b []byte, fn func(name, value []byte)) error {
	n, err := layout(b)
	if err == nil && n > 0 {
		visit(b, n, fn)
	}
	return err
}

// layout checks that b is a serialized map and returns its pair count.
func layout(b []byte) (uint64, error) {
	if len(b) == 0 || (len(b) == 1 && b[0] == 0) {
		return 0, nil
	}
	if len(b) < 4 {
		return 0, ErrMalformed
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if n > uint64(len(b)-4)/8 {
		return 0, ErrMalformed
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := uint64(0); i < n; i++ {
		kl := uint64(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if kl+vl+2 > uint64(len(data)) || data[kl] != 0 || data[kl+1+vl] != 0 {
			return 0, ErrMalformed
		}
		data = data[kl+vl+2:]
	}
	if len(data) != 0 {
		return 0, ErrMalformed
	}
	return n, nil
}

// visit walks the n pairs of b, whose layout is checked.
func visit(b []byte, n uint64, fn func(name, value []byte)) {
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := uint64(0); i < n; i++ {
		kl := uint64(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		fn(data[:kl], data[kl+1:kl+1+vl])
		data = data[kl+vl+2:]
	}
}
