package wasmhost

import (
	"bufio"
	"bytes"
	"io"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// readPlainAnswer reads, when r already holds its whole head, an answer
// of the shape a bridge or any plain service sends: "HTTP/1.1", a final
// status other than 204 and 304, header lines of a token name and a value
// of printable ASCII, one Content-Length and no Transfer-Encoding,
// Connection or Pragma. It returns the answer's header map, ":status"
// first and the rest in the order they came, names lower-cased, and its
// body of at most maxBody bytes. Anything else it leaves in r unread
// (ok false) for http.ReadResponse, which reads such answers exactly as
// it reads every other: this reads them as it would, with one string for
// all names and values instead of a canonicalized map and a string each
// (about a tenth of what a call-out cost the gateway). A call-out's
// answer is the head of the next request on its connection, so how to
// read it is settled before any byte is consumed.
func readPlainAnswer(r *bufio.Reader, maxBody int64) (hm fields.Map, body []byte, ok bool, err error) {
	if _, err := r.Peek(1); err != nil {
		return nil, nil, false, nil // http.ReadResponse meets the same error
	}
	buf, _ := r.Peek(r.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, nil, false, nil
	}
	head := buf[:end+2] // every line with its CRLF
	// The status line: "HTTP/1.1 ", three digits, then a space and a reason
	// or nothing.
	const proto = "HTTP/1.1 "
	if len(head) < len(proto)+5 || string(head[:len(proto)]) != proto {
		return nil, nil, false, nil
	}
	code := head[len(proto) : len(proto)+3]
	status := 0
	for _, c := range code {
		if c < '0' || c > '9' {
			return nil, nil, false, nil
		}
		status = status*10 + int(c-'0')
	}
	if status < 200 || status == 204 || status == 304 {
		return nil, nil, false, nil // no body, or not the final answer
	}
	line := bytes.IndexByte(head, '\n') // the status line's end
	if line < len(proto)+4 || head[line-1] != '\r' {
		return nil, nil, false, nil
	}
	if reason := head[len(proto)+3 : line-1]; len(reason) > 0 && reason[0] != ' ' || bytes.IndexByte(reason, '\r') >= 0 {
		return nil, nil, false, nil
	}
	// Header lines, checked before anything is kept.
	n, length := 0, int64(-1)
	for rest := head[line+1:]; len(rest) > 0; n++ {
		eol := bytes.IndexByte(rest, '\n')
		if eol < 1 || rest[eol-1] != '\r' {
			return nil, nil, false, nil
		}
		name, value, found := bytes.Cut(rest[:eol-1], []byte(":"))
		if !found || !plainName(name) || !plainValue(value) {
			return nil, nil, false, nil
		}
		switch {
		case asciiEqualFold(name, "content-length"):
			v := bytes.Trim(value, " \t")
			if length >= 0 || len(v) == 0 || len(v) > 18 {
				return nil, nil, false, nil
			}
			length = 0
			for _, c := range v {
				if c < '0' || c > '9' {
					return nil, nil, false, nil
				}
				length = length*10 + int64(c-'0')
			}
		case asciiEqualFold(name, "transfer-encoding"), asciiEqualFold(name, "connection"), asciiEqualFold(name, "pragma"):
			return nil, nil, false, nil
		}
		rest = rest[eol+1:]
	}
	if length < 0 {
		return nil, nil, false, nil
	}
	// Accepted: one string holds the status and every name (lower-cased)
	// and value.
	text := make([]byte, 3, 3+len(head))
	copy(text, code)
	type span struct{ name, nameEnd, value, valueEnd int }
	spans := make([]span, 0, n)
	for rest := head[line+1:]; len(rest) > 0; {
		eol := bytes.IndexByte(rest, '\n')
		name, value, _ := bytes.Cut(rest[:eol-1], []byte(":"))
		value = bytes.Trim(value, " \t")
		s := span{name: len(text)}
		for _, c := range name {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			text = append(text, c)
		}
		s.nameEnd, s.value = len(text), len(text)
		text = append(text, value...)
		s.valueEnd = len(text)
		spans = append(spans, s)
		rest = rest[eol+1:]
	}
	all := string(text)
	hm = make(fields.Map, 0, n+1)
	hm = append(hm, [2]string{":status", all[:3]})
	for _, s := range spans {
		hm = append(hm, [2]string{all[s.name:s.nameEnd], all[s.value:s.valueEnd]})
	}
	if _, err := r.Discard(end + 4); err != nil {
		return nil, nil, true, err
	}
	if length > maxBody {
		return nil, nil, true, errBodyTooLarge
	}
	body = make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, nil, true, err
	}
	return hm, body, true, nil
}

// plainName: a header name of token characters, as net/http takes it.
func plainName(b []byte) bool { return validName(b) }

// plainValue: printable ASCII and tabs, which net/http takes as they are
// (other bytes it refuses, or keeps as obs-text: left to it).
func plainValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// asciiEqualFold reports whether b is lower, ignoring ASCII case.
func asciiEqualFold(b []byte, lower string) bool {
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
