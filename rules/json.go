package rules

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// AppendJSONString appends s to dst as a JSON string. It is the one JSON
// string writer of the plugin and the wire format: check requests, 429
// bodies and log events.
//
// Valid UTF-8 passes through unchanged, so "josé" reaches the bridge as
// "josé" and matches the overrides set for that user. Each byte that is not
// part of valid UTF-8 becomes U+FFFD, so the output is always valid JSON
// (and valid UTF-8) whatever a client sent. Quotes, backslashes, control
// bytes and DEL are escaped, so a value cannot break a log line or the
// document around it. It does not allocate beyond growing dst.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0 // s[start:i] is pending, copied as is
	for i := 0; i < len(s); {
		// Eight bytes at once when none needs a look of its own: Go
		// compiled to WebAssembly pays dozens of instructions for each
		// turn of a byte loop, and keys, ids and paths are plain ASCII.
		// A word that is not plain is walked byte by byte.
		end := len(s)
		if i+8 <= len(s) {
			if plainASCII8(word8(s, i)) {
				i += 8
				continue
			}
			end = i + 8
		} else if len(s) >= 8 && plainASCII8(word8(s, len(s)-8)) {
			// The last few bytes, in the word that ends s: it overlaps
			// bytes already walked, and is plain only if they are too.
			// A UUID (36 bytes) has four of them.
			break
		}
		for i < end {
			c := s[i]
			if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
				i++
				continue
			}
			if c >= utf8.RuneSelf {
				if r, size := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || size > 1 {
					i += size
					continue
				}
			}
			dst = append(dst, s[start:i]...)
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c >= utf8.RuneSelf:
				dst = append(dst, `\ufffd`...)
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
		}
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// word8 returns the eight bytes of s from i in one load. It is unaligned,
// which WebAssembly and the CPUs the bridge runs on do in one
// instruction; Go's wasm compiler does not merge encoding/binary's
// byte-wise reads into one.
func word8(s string, i int) uint64 {
	return *(*uint64)(unsafe.Pointer(unsafe.StringData(s[i:])))
}

// plainASCII8 reports whether each byte of x (eight bytes of text) is
// printable ASCII other than a quote or a backslash, the bytes
// AppendJSONString copies as they are. Each test is exact for the word as
// a whole: some byte is below 0x20, above 0x7e, or equal to '"' or '\\'.
func plainASCII8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	below := (x - 0x20*ones) &^ x
	above := (x + (0x7f-0x7e)*ones) | x
	quote := x ^ '"'*ones // zero where x holds '"'
	quote = (quote - ones) &^ quote
	backslash := x ^ '\\'*ones
	backslash = (backslash - ones) &^ backslash
	return (below|above|quote|backslash)&highs == 0
}

// AppendJSONBytes is AppendJSONString for text held in a byte slice.
func AppendJSONBytes(dst, s []byte) []byte { return AppendJSONString(dst, bytesView(s)) }

const hexDigits = "0123456789abcdef"

// RepeatedName returns the path of the first member name that an object
// in the JSON value v has twice ("checks[1].cost"), and false when none
// has. JSON readers disagree on which value of such a member counts (the
// first, the last), so a reader that refuses it leaves nothing to guess.
func RepeatedName(v gjson.Result) (string, bool) {
	path, found := "", false
	switch {
	case v.IsObject():
		var buf [16]string // most objects' names, without allocating
		names := buf[:0]
		v.ForEach(func(k, e gjson.Result) bool {
			names = append(names, k.Str)
			if p, ok := RepeatedName(e); ok {
				path, found = k.Str+pathTail(p), true
			}
			return !found
		})
		if found {
			return path, true
		}
		slices.Sort(names)
		for i := 1; i < len(names); i++ {
			if names[i] == names[i-1] {
				return names[i], true
			}
		}
	case v.IsArray():
		i := 0
		v.ForEach(func(_, e gjson.Result) bool {
			if p, ok := RepeatedName(e); ok {
				path, found = "["+strconv.Itoa(i)+"]"+pathTail(p), true
			}
			i++
			return !found
		})
	}
	return path, found
}

// pathTail is p as it follows a name or an index in a path.
func pathTail(p string) string {
	if strings.HasPrefix(p, "[") {
		return p
	}
	return "." + p
}
