// Package fields is the HTTP header map of the proxy-wasm host, with its
// proxy-wasm serialization (internal/pwmap).
package fields

import (
	"strings"

	"github.com/sluicehq/sluice/internal/pwmap"
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

// Append appends the proxy-wasm serialization of m to dst (pwmap).
func (m Map) Append(dst []byte) []byte { return pwmap.Append(dst, m) }

// ErrMalformed reports a serialized map that breaks the layout.
var ErrMalformed = pwmap.ErrMalformed

// Parse decodes a serialized map that came from guest memory, its names
// lower-cased. Empty input and a single zero byte are both the empty map.
func Parse(b []byte) (Map, error) {
	m, err := pwmap.Pairs(b)
	for i := range m {
		m[i][0] = strings.ToLower(m[i][0])
	}
	return m, err
}

// Visit calls fn with each pair of a serialized map that came from guest
// memory, in order, as views into b, once the whole layout is checked: fn
// never sees part of a malformed map. Names are as the guest wrote them.
func Visit(b []byte, fn func(name, value []byte)) error { return pwmap.Visit(b, fn) }
