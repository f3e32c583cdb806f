package rules

// A cost read from the response body as it passes the proxy (on_response's
// cost_body): a language model's API says what a request cost in its
// answer's JSON ("usage": {"total_tokens": 1234}), or, when it streams the
// answer as server-sent events, in the JSON of its last data line. The
// body passes in pieces and none of it is kept: a small state machine
// follows the JSON and remembers only where it is.

import "bytes"

// BodyCost finds the number at a path of object keys in a JSON body, or
// in the JSON of each "data:" line of an event stream, from the body's
// pieces in order. Its zero value finds nothing; Reset starts a body.
type BodyCost struct {
	path  []string
	sse   bool
	cost  int64
	found bool

	// The event stream's line: whether it is a data line, how much of
	// its "data:" prefix was seen, and whether its JSON has started (the
	// one space after the prefix is not the JSON's).
	line        uint8
	prefix      int
	dataStarted bool

	// The JSON document being read (one per data line of a stream).
	st      uint8
	depth   int    // containers open
	onDepth int    // containers open along the path: depth up to which every key matched
	arrays  uint64 // bit d-1: the container at depth d is an array
	key     int    // bytes of the key being read that match the path's; -1: it does not
	hex     int    // hex digits of a \u escape in a key still to read
	code    rune   // the \u escape's code point so far
	matched bool   // the last key read is the path's at its depth
	target  bool   // the value being read is at the path
	num     int64  // the number being read, capped at MaxLimitValue
	integer bool   // it is a non-negative integer so far
	hit     bool   // the document had a value at the path: only the first counts, as in gjson's paths
}

// JSON states.
const (
	jValue    uint8 = iota // a value is next
	jKeyOrEnd              // a key or the end of the object just opened
	jKey                   // in a key
	jKeyEscape
	jKeyHex // in a key's \u escape, hex digits left to read
	jColon  // after a key
	jString
	jStringEscape
	jNumber
	jLiteral // true, false, null
	jAfter   // after a value in a container
	jDone    // the document's value is complete
	jBad     // not JSON: the rest of the document is not read
)

// Event stream line states.
const (
	lineStart uint8 = iota // at the start of a line, prefix bytes of "data:" seen
	lineData               // in a data line's JSON (dataStarted: past its start)
	lineOther              // in a line that is not a data line
)

// maxBodyDepth bounds the containers a body may nest: a state bit each.
const maxBodyDepth = 64

// Reset starts reading a body for the number at path (object keys, from
// the outermost, as on_response's cost_body gives them); sse: the body is
// an event stream (text/event-stream), whose data lines are each a JSON
// document.
func (b *BodyCost) Reset(path []string, sse bool) {
	*b = BodyCost{path: path, sse: sse}
}

// Cost returns the number found: in a JSON body, the first at the path;
// in an event stream, the one of the last data line that has it.
func (b *BodyCost) Cost() (int64, bool) { return b.cost, b.found }

// Write reads the next piece of the body.
func (b *BodyCost) Write(p []byte) {
	if !b.sse {
		b.json(p)
		return
	}
	for len(p) > 0 {
		switch b.line {
		case lineStart:
			const data = "data:"
			c := p[0]
			switch {
			case c == '\n' || c == '\r':
				b.prefix = 0
				p = p[1:]
			case b.prefix < len(data) && c == data[b.prefix]:
				b.prefix++
				p = p[1:]
				if b.prefix == len(data) {
					b.line, b.prefix, b.dataStarted = lineData, 0, false
					b.startDocument()
				}
			default:
				b.line = lineOther
			}
		case lineData:
			if !b.dataStarted && p[0] == ' ' { // the one space after "data:"
				p = p[1:]
			}
			b.dataStarted = true
			end := indexLineEnd(p)
			if end < 0 {
				b.json(p)
				return
			}
			b.json(p[:end])
			b.endDocument()
			b.line, b.prefix = lineStart, 0
			p = p[end:]
		case lineOther:
			end := indexLineEnd(p)
			if end < 0 {
				return
			}
			b.line, b.prefix = lineStart, 0
			p = p[end:]
		}
	}
}

// indexLineEnd is the index of the first \n or \r in p, -1 if none:
// IndexByte twice, the runtime's assembly, rather than a loop per byte.
func indexLineEnd(p []byte) int {
	i := bytes.IndexByte(p, '\n')
	end := p
	if i >= 0 {
		end = p[:i]
	}
	if j := bytes.IndexByte(end, '\r'); j >= 0 {
		return j
	}
	return i
}

func (b *BodyCost) startDocument() {
	b.st, b.depth, b.onDepth, b.arrays, b.target, b.matched, b.hit = jValue, 0, 0, 0, false, false, false
}

// endDocument ends a data line's document: a number at its end ends there.
func (b *BodyCost) endDocument() {
	if b.st == jNumber {
		b.endValue()
	}
}

// json reads the next bytes of the current document.
func (b *BodyCost) json(p []byte) {
	for i := 0; i < len(p); {
		c := p[i]
		switch b.st {
		case jDone, jBad:
			return
		case jValue:
			if isSpace(c) {
				break
			}
			b.value(c)
		case jKeyOrEnd:
			switch {
			case isSpace(c):
			case c == '"':
				b.startKey()
			case c == '}':
				b.pop()
			default:
				b.st = jBad
			}
		case jKey:
			switch c {
			case '\\':
				b.st = jKeyEscape
			case '"':
				b.matched = b.key >= 0 && b.key == len(b.path[b.depth-1])
				b.st = jColon
			default:
				b.keyByte(c)
			}
		case jKeyEscape:
			b.st = jKey
			switch c {
			case 'u':
				b.st, b.hex, b.code = jKeyHex, 4, 0
			case 'b':
				b.keyByte('\b')
			case 'f':
				b.keyByte('\f')
			case 'n':
				b.keyByte('\n')
			case 'r':
				b.keyByte('\r')
			case 't':
				b.keyByte('\t')
			default: // " \ /
				b.keyByte(c)
			}
		case jKeyHex:
			d := unhex(c)
			if d < 0 {
				b.key, d = -1, 0 // not JSON: no key of the path
			}
			b.code = b.code<<4 | rune(d)
			if b.hex--; b.hex == 0 {
				b.st = jKey
				if b.code < 0x80 {
					b.keyByte(byte(b.code))
				} else {
					b.key = -1 // the path's keys are ASCII
				}
			}
		case jColon:
			switch {
			case isSpace(c):
			case c == ':':
				b.target = b.matched && b.depth == len(b.path)
				b.st = jValue
			default:
				b.st = jBad
			}
		case jString:
			switch c {
			case '\\':
				b.st = jStringEscape
			case '"':
				b.endValue()
			default:
				// Most of a model's answer is the text of a string: skip
				// to its next quote or backslash at once (IndexByte is
				// the runtime's assembly, on WebAssembly too).
				rest := p[i:]
				if j := bytes.IndexByte(rest, '"'); j >= 0 {
					rest = rest[:j]
				}
				if j := bytes.IndexByte(rest, '\\'); j >= 0 {
					rest = rest[:j]
				}
				i += len(rest)
				continue
			}
		case jStringEscape:
			b.st = jString
		case jNumber:
			switch {
			case c >= '0' && c <= '9':
				b.num = min(b.num*10+int64(c-'0'), MaxLimitValue)
			case c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-':
				b.integer = false
			default:
				b.endValue()
				continue // c follows the number
			}
		case jLiteral:
			if c >= 'a' && c <= 'z' {
				break
			}
			b.endValue()
			continue // c follows the literal
		case jAfter:
			switch {
			case isSpace(c):
			case c == ',':
				if b.inArray() {
					b.st = jValue
				} else {
					b.st = jKeyOrEnd
				}
			case c == '}' && !b.inArray(), c == ']' && b.inArray():
				b.pop()
			default:
				b.st = jBad
			}
		}
		i++
	}
}

// value starts a value with its first byte c.
func (b *BodyCost) value(c byte) {
	switch {
	case c == '{':
		// The document's object is on the path, and so is one that is the
		// value of a key on it (the key matched, the path goes on).
		onPath := b.depth == 0 || b.matched && b.depth == b.onDepth && b.depth < len(b.path)
		if !b.push(false) {
			return
		}
		if onPath {
			b.onDepth = b.depth
		}
		b.st = jKeyOrEnd
	case c == '[':
		if !b.push(true) {
			return
		}
		b.st = jValue
	case c == ']' && b.inArray(): // an empty array
		b.pop()
	case c == '"':
		b.st = jString
	case c >= '0' && c <= '9':
		b.st, b.num, b.integer = jNumber, int64(c-'0'), true
	case c == '-':
		b.st, b.num, b.integer = jNumber, 0, false
	case c == 't' || c == 'f' || c == 'n':
		b.st = jLiteral
	default:
		b.st = jBad
	}
	b.matched = false
	// The first value at the path, of whatever type, is the one: a later
	// one (a key given twice) does not stand in for it.
	if b.target && b.hit {
		b.target = false
	}
	b.hit = b.hit || b.target
	if c == '{' || c == '[' {
		b.target = false // an object or array at the path is no number
	}
}

// startKey starts a key: compared with the path's when its object is on
// the path.
func (b *BodyCost) startKey() {
	b.st, b.key = jKey, -1
	if b.depth == b.onDepth && b.depth <= len(b.path) {
		b.key = 0
	}
}

// keyByte compares the next byte of a key with the path's key.
func (b *BodyCost) keyByte(c byte) {
	if b.key < 0 {
		return
	}
	if k := b.path[b.depth-1]; b.key < len(k) && k[b.key] == c {
		b.key++
	} else {
		b.key = -1
	}
}

// endValue ends a value: a non-negative integer at the path is the cost.
func (b *BodyCost) endValue() {
	if b.st == jNumber && b.target && b.integer {
		b.cost, b.found = b.num, true
	}
	b.target = false
	b.after()
}

// after moves past a value: to its container's next, or the document's end.
func (b *BodyCost) after() {
	if b.depth == 0 {
		b.st = jDone
	} else {
		b.st = jAfter
	}
}

// push opens a container; false when too deep to follow, and the rest of
// the document is not read.
func (b *BodyCost) push(array bool) bool {
	if b.depth == maxBodyDepth {
		b.st = jBad
		return false
	}
	if array {
		b.arrays |= 1 << b.depth
	}
	b.depth++
	return true
}

func (b *BodyCost) pop() {
	if b.onDepth == b.depth {
		b.onDepth--
	}
	b.depth--
	b.arrays &^= 1 << b.depth
	b.after()
}

func (b *BodyCost) inArray() bool { return b.depth > 0 && b.arrays&(1<<(b.depth-1)) != 0 }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
