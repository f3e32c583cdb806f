package wasmhost

import (
	"bufio"
	"bytes"
	"io"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

// readPlainAnswer reads, when r already holds its whole head, an answer
// of the shape a bridge or any plain service sends: "HTTP/1.1", a final
// status other than 204 and 304, at most maxPlainHeaders header lines of
// a token name and a value of printable ASCII, one Content-Length and no
// Transfer-Encoding, Connection or Pragma. It returns the answer's header
// map, ":status" first and the rest in the order they came, names
// lower-cased, and its body of at most maxBody bytes. Anything else it
// leaves in r unread (ok false) for http.ReadResponse, which reads such
// answers exactly as it reads every other: this reads them as it would,
// in one pass, with one string for all names and values instead of a
// canonicalized map and a string each (about a tenth of what a call-out
// cost the gateway). A call-out's answer is the head of the next request
// on its connection, so how to read it is settled before any byte is
// consumed.
func readPlainAnswer(r *bufio.Reader, maxBody int64) (hm fields.Map, body []byte, ok bool, err error) {
	if _, err := r.Peek(1); err != nil {
		return nil, nil, false, nil // http.ReadResponse meets the same error
	}
	buf, _ := r.Peek(r.Buffered())
	// The status line: "HTTP/1.1 ", three digits, then a space and a reason
	// or nothing.
	const proto = "HTTP/1.1 "
	line := bytes.IndexByte(buf, '\n') // the status line's end
	if line < len(proto)+4 || buf[line-1] != '\r' || string(buf[:len(proto)]) != proto {
		return nil, nil, false, nil
	}
	code := buf[len(proto) : len(proto)+3]
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
	if reason := buf[len(proto)+3 : line-1]; len(reason) > 0 && reason[0] != ' ' || bytes.IndexByte(reason, '\r') >= 0 {
		return nil, nil, false, nil
	}
	// Header lines up to the empty one, each checked, its name lower-cased
	// and its value trimmed into text as it is read.
	text := make([]byte, 3, 3+len(buf))
	copy(text, code)
	var spans [maxPlainHeaders]struct{ name, value, end int }
	n, length := 0, int64(-1)
	pos := line + 1
	for {
		eol := bytes.IndexByte(buf[pos:], '\n')
		if eol < 1 || buf[pos+eol-1] != '\r' {
			return nil, nil, false, nil // a bare LF, or the head is not all there
		}
		lineEnd := pos + eol - 1 // at its CR
		if lineEnd == pos {
			pos += 2
			break
		}
		if n == len(spans) {
			return nil, nil, false, nil
		}
		colon := bytes.IndexByte(buf[pos:lineEnd], ':')
		if colon < 1 {
			return nil, nil, false, nil // no colon, or no name
		}
		s := &spans[n]
		s.name = len(text)
		text = append(text, buf[pos:pos+colon]...)
		name := text[s.name:]
		if !validName(name) {
			return nil, nil, false, nil
		}
		lowerASCII(name)
		s.value = len(text)
		value := bytes.Trim(buf[pos+colon+1:lineEnd], " \t")
		for _, c := range value {
			if (c < ' ' && c != '\t') || c >= 0x7f {
				return nil, nil, false, nil // net/http refuses it, or keeps it as obs-text
			}
		}
		text = append(text, value...)
		s.end = len(text)
		switch string(text[s.name:s.value]) {
		case "content-length":
			if length >= 0 || len(value) == 0 || len(value) > 18 {
				return nil, nil, false, nil
			}
			length = 0
			for _, c := range value {
				if c < '0' || c > '9' {
					return nil, nil, false, nil
				}
				length = length*10 + int64(c-'0')
			}
		case "transfer-encoding", "connection", "pragma":
			return nil, nil, false, nil
		}
		n++
		pos = lineEnd + 2
	}
	if length < 0 {
		return nil, nil, false, nil
	}
	all := string(text)
	hm = make(fields.Map, 0, n+1)
	hm = append(hm, [2]string{":status", all[:3]})
	for _, s := range spans[:n] {
		hm = append(hm, [2]string{all[s.name:s.value], all[s.value:s.end]})
	}
	if _, err := r.Discard(pos); err != nil {
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

// maxPlainHeaders bounds the header lines readPlainAnswer takes; an answer
// with more is read by net/http.
const maxPlainHeaders = 32
