package rules

import "unicode/utf8"

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
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendJSONBytes is AppendJSONString for text held in a byte slice.
func AppendJSONBytes(dst, s []byte) []byte { return AppendJSONString(dst, bytesView(s)) }

const hexDigits = "0123456789abcdef"
