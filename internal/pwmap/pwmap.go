// Package pwmap is the proxy-wasm ABI's serialized map of pairs, the form
// in which header maps and call-out headers cross between a host and its
// guest: the pair count, then each key's and value's length, then each key
// and value followed by a NUL, all integers little-endian uint32. The
// guest's binding (plugin/proxywasm) and the host (wasmhost) both read and
// write it here. It uses only encoding/binary and errors, so the plugin
// linking it keeps its import list.
package pwmap

import (
	"encoding/binary"
	"errors"
)

// ErrMalformed reports bytes that do not follow the layout.
var ErrMalformed = errors.New("malformed proxy-wasm header map")

// Append appends the serialization of pairs to dst. An empty map appends
// nothing, as the hosts write it.
func Append(dst []byte, pairs [][2]string) []byte {
	if len(pairs) == 0 {
		return dst
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(append(dst, p[0]...), 0)
		dst = append(append(dst, p[1]...), 0)
	}
	return dst
}

// Len checks that b is a serialized map and returns its pair count. No
// bytes and a single NUL are both the empty map.
func Len(b []byte) (int, error) {
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
	return int(n), nil
}

// Visit calls fn with each pair of b, in order, as views into b, once the
// whole layout is checked: fn never sees part of a malformed map.
func Visit(b []byte, fn func(name, value []byte)) error {
	n, err := Len(b)
	if err == nil {
		walk(b, n, fn)
	}
	return err
}

// Pairs returns a copy of the pairs of b; nil for the empty map.
func Pairs(b []byte) ([][2]string, error) {
	n, err := Len(b)
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([][2]string, 0, n)
	walk(b, n, func(k, v []byte) { out = append(out, [2]string{string(k), string(v)}) })
	return out, nil
}

// walk calls fn with the n pairs of b, whose layout Len has checked.
func walk(b []byte, n int, fn func(name, value []byte)) {
	if n == 0 {
		return
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := 0; i < n; i++ {
		kl := uint64(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		fn(data[:kl], data[kl+1:kl+1+vl])
		data = data[kl+vl+2:]
	}
}
