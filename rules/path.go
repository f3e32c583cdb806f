package rules

import (
	"errors"
	"strings"
)

// Path patterns as written in config:
//
//	/api/v1/login        exact
//	prefix:/api/v        raw byte prefix
//	/files/*.json        "*" is any run of bytes inside one segment
//	/v1/*/items
//	/api/**              "**" as a whole segment is zero or more segments
//
// Patterns are compiled once (ParsePathPattern); Match runs per request,
// walks the path by index and does not allocate.

// MaxPathPatternLen bounds a pattern so that matching cost stays bounded.
const MaxPathPatternLen = 1024

const prefixMarker = "prefix:"

// Errors of ParsePathPattern carry no field path; the caller adds it.
var (
	errPathEmpty    = errors.New("path pattern is empty")
	errPathTooLong  = errors.New("path pattern is longer than 1024 bytes")
	errPathSlash    = errors.New(`path pattern must start with "/"`)
	errPathControl  = errors.New("path pattern contains a control byte")
	errPathQuery    = errors.New(`path pattern must not contain "?" or "#" (the query and fragment are never matched)`)
	errPathStarStar = errors.New(`"**" must be a whole segment ("/a/**/b", not "/a/**x")`)
)

// ParsePathPattern compiles a path pattern.
func ParsePathPattern(s string) (PathPattern, error) {
	p := PathPattern{Raw: s}
	if s == "" {
		return p, errPathEmpty
	}
	if len(s) > MaxPathPatternLen {
		return p, errPathTooLong
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c == 0x7f:
			return p, errPathControl
		case c == '?' || c == '#':
			return p, errPathQuery
		}
	}
	if strings.HasPrefix(s, prefixMarker) {
		text := s[len(prefixMarker):]
		if !strings.HasPrefix(text, "/") {
			return p, errPathSlash
		}
		p.Kind, p.Text = PatternPrefix, text
		return p, nil
	}
	if s[0] != '/' {
		return p, errPathSlash
	}
	if strings.IndexByte(s, '*') < 0 {
		p.Kind, p.Text = PatternExact, s
		return p, nil
	}
	p.Kind = PatternGlob
	p.Segs = strings.Split(s[1:], "/")
	for _, seg := range p.Segs {
		if seg != "**" && strings.Contains(seg, "**") {
			return PathPattern{Raw: s}, errPathStarStar
		}
	}
	// The commonest glob, a path and everything below it, is a comparison
	// of bytes rather than a walk over segments.
	if base, ok := strings.CutSuffix(s, "/**"); ok && strings.IndexByte(base, '*') < 0 {
		p.Kind, p.Text = PatternSubtree, base
	}
	return p, nil
}

// Match reports whether the request path matches. The query string and a
// fragment are ignored; the comparison is case-sensitive and byte-wise (the
// proxy is expected to normalize paths before filters run).
func (p *PathPattern) Match(path string) bool { return p.matchPath(stripQuery(path)) }

// matchPath matches a path without its query.
func (p *PathPattern) matchPath(path string) bool {
	switch p.Kind {
	case PatternExact:
		return path == p.Text
	case PatternPrefix:
		return strings.HasPrefix(path, p.Text)
	case PatternSubtree:
		n := len(p.Text)
		if len(path) < n || path[:n] != p.Text {
			return false
		}
		return len(path) == n && n > 0 || len(path) > n && path[n] == '/'
	case PatternGlob:
		return matchSegments(p.Segs, path)
	}
	return false
}

// stripQuery cuts path at the first '?' or '#'. Every request a proxy
// sees is cut, most of them with no query: it steps eight bytes at a time
// while neither byte is among them.
func stripQuery(path string) string {
	i := 0
	for ; i+8 <= len(path); i += 8 {
		if hasQueryByte8(word8(path, i)) {
			break
		}
	}
	for ; i < len(path); i++ {
		if path[i] == '?' || path[i] == '#' {
			return path[:i]
		}
	}
	return path
}

// hasQueryByte8 reports whether one of the eight bytes of x is '?' or
// '#'. Each test is exact for the word as a whole: x^c*ones has a zero
// byte where x holds c.
func hasQueryByte8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q := x ^ '?'*ones
	h := x ^ '#'*ones
	return ((q-ones)&^q|(h-ones)&^h)&highs != 0
}

// matchSegments matches path segment by segment, with "**" as a star over
// whole segments. It is the classic two-pointer wildcard match: on a
// mismatch it resumes after the most recent "**", which then absorbs one
// more segment. Because each pattern segment other than "**" consumes
// exactly one path segment, resuming only from the latest "**" is enough,
// so the cost is O(len(segs) × segments(path)) segment comparisons, never
// exponential however many "**" a pattern has.
func matchSegments(segs []string, path string) bool {
	if len(path) == 0 || path[0] != '/' {
		return false
	}
	end := len(path) + 1 // position past the last segment
	pi, si := 0, 1       // pattern segment index, offset of the current path segment
	starP, starS := -1, 0
	for si < end {
		if pi < len(segs) && segs[pi] == "**" {
			starP, starS = pi, si
			pi++
			continue
		}
		segEnd := segmentEnd(path, si)
		if pi < len(segs) && matchSegment(segs[pi], path[si:segEnd]) {
			pi++
			si = segEnd + 1
			continue
		}
		if starP < 0 {
			return false
		}
		// Let the last "**" absorb one more path segment and retry.
		starS = segmentEnd(path, starS) + 1
		pi, si = starP+1, starS
	}
	for pi < len(segs) && segs[pi] == "**" {
		pi++
	}
	return pi == len(segs)
}

func segmentEnd(path string, from int) int {
	for i := from; i < len(path); i++ {
		if path[i] == '/' {
			return i
		}
	}
	return len(path)
}

// matchSegment matches one segment against a pattern where '*' is any run
// of bytes, with the same two-pointer method (O(len(pat) × len(seg))).
func matchSegment(pat, seg string) bool {
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(seg) {
		switch {
		case pi < len(pat) && pat[pi] == '*':
			starP, starS = pi, si
			pi++
		case pi < len(pat) && pat[pi] == seg[si]:
			pi++
			si++
		case starP >= 0:
			starS++
			pi, si = starP+1, starS
		default:
			return false
		}
	}
	for pi < len(pat) && pat[pi] == '*' {
		pi++
	}
	return pi == len(pat)
}
