package rules

import (
	"strings"
	"unsafe"
)

// queryHolds reports whether fm holds for the query of path (what follows
// its first '?', up to a '#'), before fm.Invert: whether the value of one
// of the parameters named fm.Name passes fm's comparison. Names and
// values are compared decoded, as the application reads them ('+' is a
// space, %XX the byte), so that an encoding of the same text does not
// escape a limit; and any parameter of that name counts, not only the
// first, so that a client cannot hide the one a limit looks for behind
// another of the same name. A '%' not followed by two hex digits is
// itself. It allocates nothing, unless a value over 256 bytes is to be
// decoded.
func queryHolds(path string, fm *FieldMatch) bool {
	for q := query(path); q != ""; {
		var name, value string
		name, value, q = nextParam(q)
		if unescapedEqual(name, fm.Name) && valueHolds(value, fm) {
			return true
		}
	}
	return false
}

// firstParam is the value of path's first query parameter named name,
// as written (undecoded), "" for none.
func firstParam(path, name string) string {
	for q := query(path); q != ""; {
		var n, value string
		n, value, q = nextParam(q)
		if unescapedEqual(n, name) {
			return value
		}
	}
	return ""
}

// query is path's query: what follows its first '?', up to a '#'.
func query(path string) string {
	i := strings.IndexAny(path, "?#")
	if i < 0 || path[i] == '#' {
		return ""
	}
	q := path[i+1:]
	if j := strings.IndexByte(q, '#'); j >= 0 {
		q = q[:j]
	}
	return q
}

// nextParam splits the first parameter off q, a query: its name and value
// as written (a parameter without '=' has an empty value), and the rest.
func nextParam(q string) (name, value, rest string) {
	pair, rest, _ := strings.Cut(q, "&")
	name, value, _ = strings.Cut(pair, "=")
	return name, value, rest
}

// encoded tells whether raw, a query's name or value, has anything to
// decode.
func encoded(raw string) bool { return strings.ContainsAny(raw, "%+") }

// valueHolds reports whether raw, a query parameter's value, passes fm's
// comparison, decoded.
func valueHolds(raw string, fm *FieldMatch) bool {
	switch {
	case fm.Op == FieldPresent:
		return raw != "" // one byte or more decodes to one or more
	case fm.Op == FieldEquals:
		return unescapedEqual(raw, fm.Value)
	case !encoded(raw):
		return fm.holds(raw)
	}
	var buf [256]byte
	b := appendUnescaped(buf[:0], raw)
	return fm.holds(unsafe.String(unsafe.SliceData(b), len(b)))
}

// queryParam is the value of r's first query parameter named name,
// decoded, "" for none: a view of the path when it has nothing to decode,
// else of p's buffer for decoded values, which Evaluate reuses.
func (p *Plan) queryParam(r *Request, name string) string {
	raw := firstParam(r.Path, name)
	if !encoded(raw) {
		return raw
	}
	start := len(p.decoded)
	p.decoded = appendUnescaped(p.decoded, raw)
	return unsafe.String(&p.decoded[start], len(p.decoded)-start)
}

// unescapedEqual reports whether raw, a query's name or value, decodes to
// want.
func unescapedEqual(raw, want string) bool {
	j := 0
	for i := 0; i < len(raw); j++ {
		var c byte
		if c, i = unescapedByte(raw, i); j == len(want) || want[j] != c {
			return false
		}
	}
	return j == len(want)
}

// appendUnescaped appends raw, a query's name or value, decoded.
func appendUnescaped(dst []byte, raw string) []byte {
	for i := 0; i < len(raw); {
		var c byte
		c, i = unescapedByte(raw, i)
		dst = append(dst, c)
	}
	return dst
}

// unescapedByte is the byte raw, a query's name or value, decodes to at i,
// and where the next one starts: '+' is a space, %XX the byte, and a '%'
// not followed by two hex digits is itself.
func unescapedByte(raw string, i int) (byte, int) {
	c := raw[i]
	switch {
	case c == '+':
		return ' ', i + 1
	case c == '%' && i+2 < len(raw):
		if hi, lo := unhex(raw[i+1]), unhex(raw[i+2]); hi >= 0 && lo >= 0 {
			return byte(hi<<4 | lo), i + 3
		}
	}
	return c, i + 1
}
