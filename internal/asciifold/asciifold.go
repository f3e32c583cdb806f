// Package asciifold compares header names and tokens as HTTP does: ASCII
// letters in any case, every other byte as it is. The host's call-outs,
// the bridge's HTTP/1.1 fast path and the in-process call-outs share it.
package asciifold

// EqualLower reports whether b, its ASCII letters lower-cased, is lower,
// which is lower-case.
func EqualLower(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// Lower is s with its ASCII letters lower-cased; s itself, not a copy,
// when it has none upper-case.
func Lower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
