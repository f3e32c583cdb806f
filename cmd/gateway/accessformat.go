package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

// defaultAccessFormat is Envoy's default access log format.
const defaultAccessFormat = `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" ` +
	`%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ` +
	`%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" ` +
	`"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"` + "\n"

// accessFormat is an access log format compiled once, at start: Envoy's
// format string (--access-log-format), or its format dictionary with typed
// values (--access-log-json, Envoy's typed_json_format). A command
// operator the gateway does not have is refused then, with its name,
// never met per request. A line renders without allocating.
type accessFormat struct {
	text   []fmtPart   // a format string
	dict   []dictField // a format dictionary
	isDict bool
}

// fmtPart is literal text, then an operator's value (op 0: none).
type fmtPart struct {
	lit string
	op  fmtOp
}

// fmtOp is a command operator and its arguments.
type fmtOp struct {
	kind       opKind
	name, alt  string     // REQ and RESP: the header, and the one used when it is absent
	max        int        // REQ and RESP: bytes kept of the value, 0 all
	timeLayout []timePart // START_TIME(...); nil: Envoy's default
}

type opKind uint8

const (
	opNone opKind = iota
	opStartTime
	opReq
	opResp
	opProtocol
	opResponseCode
	opResponseFlags
	opBytesReceived
	opBytesSent
	opDuration
	opUpstreamHost
	opRemoteAddress
	opRemoteAddressNoPort
	opRemotePort
	opLocalAddress
	opLocalAddressNoPort
	opLocalPort
	opHostname
)

// operators are the command operators the gateway has, by Envoy's names.
// The DIRECT_ ones are the same as the others: the gateway takes the peer
// from the connection, never from a header or the PROXY protocol.
var operators = map[string]opKind{
	"START_TIME": opStartTime, "REQ": opReq, "REQUEST_HEADER": opReq, "RESP": opResp, "RESPONSE_HEADER": opResp,
	"PROTOCOL": opProtocol, "RESPONSE_CODE": opResponseCode, "RESPONSE_FLAGS": opResponseFlags,
	"BYTES_RECEIVED": opBytesReceived, "BYTES_SENT": opBytesSent, "DURATION": opDuration,
	"UPSTREAM_HOST":             opUpstreamHost,
	"DOWNSTREAM_REMOTE_ADDRESS": opRemoteAddress, "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT": opRemoteAddressNoPort,
	"DOWNSTREAM_REMOTE_PORT": opRemotePort, "DOWNSTREAM_DIRECT_REMOTE_ADDRESS": opRemoteAddress,
	"DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT": opRemoteAddressNoPort, "DOWNSTREAM_DIRECT_REMOTE_PORT": opRemotePort,
	"DOWNSTREAM_LOCAL_ADDRESS": opLocalAddress, "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT": opLocalAddressNoPort,
	"DOWNSTREAM_LOCAL_PORT": opLocalPort, "HOSTNAME": opHostname,
}

// numeric operators render as JSON numbers in a format dictionary.
func (k opKind) numeric() bool {
	switch k {
	case opResponseCode, opBytesReceived, opBytesSent, opDuration:
		return true
	}
	return false
}

// parseTextFormat compiles a format string. A line ends with a newline:
// one is added when the format has none at its end.
func parseTextFormat(s string) ([]fmtPart, error) {
	parts, err := parseFormat(s)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(s, "\n") {
		parts = append(parts, fmtPart{lit: "\n"})
	}
	return parts, nil
}

// parseFormat compiles s: literal text and %OPERATOR%, %OPERATOR(ARG)% or
// %OPERATOR(ARG):MAX%.
func parseFormat(s string) ([]fmtPart, error) {
	var parts []fmtPart
	var lit strings.Builder
	for len(s) > 0 {
		i := strings.IndexByte(s, '%')
		if i < 0 {
			lit.WriteString(s)
			break
		}
		lit.WriteString(s[:i])
		s = s[i+1:]
		end := operatorEnd(s)
		if end < 0 {
			return nil, fmt.Errorf("%q: a %% that starts no command operator", "%"+s)
		}
		op, err := parseOperator(s[:end])
		if err != nil {
			return nil, err
		}
		parts = append(parts, fmtPart{lit: lit.String(), op: op})
		lit.Reset()
		s = s[end+1:]
	}
	if lit.Len() > 0 {
		parts = append(parts, fmtPart{lit: lit.String()})
	}
	return parts, nil
}

// operatorEnd is the index in s (after an opening %) of the % that closes
// the operator: the first one outside its parentheses, whose argument (a
// START_TIME layout) may hold %.
func operatorEnd(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case '%':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// parseOperator compiles one operator, the text between its two %.
func parseOperator(s string) (fmtOp, error) {
	name, arg, length := s, "", ""
	hasArg := false
	if i := strings.IndexByte(s, '('); i >= 0 {
		j := strings.LastIndexByte(s, ')')
		if j < i {
			return fmtOp{}, fmt.Errorf("%%%s%%: no closing parenthesis", s)
		}
		name, arg, hasArg = s[:i], s[i+1:j], true
		if rest := s[j+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return fmtOp{}, fmt.Errorf("%%%s%%: %q after the argument, want :LENGTH", s, rest)
			}
			length = rest[1:]
		}
	}
	kind, ok := operators[name]
	if !ok {
		return fmtOp{}, fmt.Errorf("%%%s%%: not a command operator the gateway has (it has %s)", s, operatorNames())
	}
	op := fmtOp{kind: kind}
	switch kind {
	case opReq, opResp:
		if !hasArg || arg == "" {
			return fmtOp{}, fmt.Errorf("%%%s%%: names no header, want %s(NAME) or %s(NAME?ALTERNATIVE)", s, name, name)
		}
		h, alt, _ := strings.Cut(arg, "?")
		op.name, op.alt = headerKey(h), headerKey(alt)
		if length != "" {
			n, err := strconv.Atoi(length)
			if err != nil || n < 1 {
				return fmtOp{}, fmt.Errorf("%%%s%%: length %q, want a positive number", s, length)
			}
			op.max = n
		}
		return op, nil
	case opStartTime:
		if hasArg {
			layout, err := parseTimeLayout(arg)
			if err != nil {
				return fmtOp{}, fmt.Errorf("%%%s%%: %w", s, err)
			}
			op.timeLayout = layout
		}
	default:
		if hasArg {
			return fmtOp{}, fmt.Errorf("%%%s%%: %s takes no argument", s, name)
		}
	}
	if length != "" {
		return fmtOp{}, fmt.Errorf("%%%s%%: only REQ and RESP take a length", s)
	}
	return op, nil
}

func operatorNames() string {
	names := make([]string, 0, len(operators))
	for n := range operators {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// headerKey is the header map's key for a header name in a format; the
// request's pseudo headers keep their lower-case name.
func headerKey(name string) string {
	if strings.HasPrefix(name, ":") {
		return strings.ToLower(name)
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// timePart is literal text, then a field of the time (0: none).
type timePart struct {
	lit   string
	field byte // a strftime conversion: Y m d H M S y j z s T F, or f with digits
	digit int  // f: fractional digits
}

// parseTimeLayout compiles START_TIME's strftime layout, with Envoy's %s
// (Unix seconds) and %f / %1f..%9f (fractions of a second).
func parseTimeLayout(s string) ([]timePart, error) {
	var parts []timePart
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			lit.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return nil, errors.New("the layout ends with %")
		}
		i++
		c, digits := s[i], 9
		if c >= '1' && c <= '9' && i+1 < len(s) && s[i+1] == 'f' {
			digits, c = int(c-'0'), 'f'
			i++
		}
		switch c {
		case '%':
			lit.WriteByte('%')
			continue
		case 'Y', 'm', 'd', 'H', 'M', 'S', 'y', 'j', 'z', 's', 'T', 'F', 'f':
		default:
			return nil, fmt.Errorf("%%%c: not a conversion the gateway has (it has %%Y %%m %%d %%H %%M %%S %%y %%j %%z %%s %%T %%F %%f %%1f..%%9f %%%%)", c)
		}
		parts = append(parts, timePart{lit: lit.String(), field: c, digit: digits})
		lit.Reset()
	}
	if lit.Len() > 0 {
		parts = append(parts, timePart{lit: lit.String()})
	}
	return parts, nil
}

// appendTime appends t (UTC) in layout; nil is Envoy's default,
// 2006-01-02T15:04:05.000Z.
func appendTime(b []byte, t time.Time, layout []timePart) []byte {
	t = t.UTC()
	if layout == nil {
		return t.AppendFormat(b, "2006-01-02T15:04:05.000Z")
	}
	for _, p := range layout {
		b = append(b, p.lit...)
		switch p.field {
		case 'Y':
			b = appendPadded(b, int64(t.Year()), 4)
		case 'm':
			b = appendPadded(b, int64(t.Month()), 2)
		case 'd':
			b = appendPadded(b, int64(t.Day()), 2)
		case 'H':
			b = appendPadded(b, int64(t.Hour()), 2)
		case 'M':
			b = appendPadded(b, int64(t.Minute()), 2)
		case 'S':
			b = appendPadded(b, int64(t.Second()), 2)
		case 'y':
			b = appendPadded(b, int64(t.Year()%100), 2)
		case 'j':
			b = appendPadded(b, int64(t.YearDay()), 3)
		case 'z':
			b = append(b, "+0000"...)
		case 's':
			b = strconv.AppendInt(b, t.Unix(), 10)
		case 'T':
			b = t.AppendFormat(b, "15:04:05")
		case 'F':
			b = t.AppendFormat(b, "2006-01-02")
		case 'f':
			ns := int64(t.Nanosecond())
			for range 9 - p.digit {
				ns /= 10
			}
			b = appendPadded(b, ns, p.digit)
		}
	}
	return b
}

func appendPadded(b []byte, n int64, width int) []byte {
	for w, v := 1, n/10; w < width; w, v = w+1, v/10 {
		if v == 0 {
			b = append(b, '0')
		}
	}
	return strconv.AppendInt(b, n, 10)
}

// dictField is one key of a format dictionary: its value a format string
// (typed when it is one operator alone), or a dictionary nested in it.
type dictField struct {
	key    string // the key as JSON, with the comma before it when not first
	value  []fmtPart
	typed  bool // the value is one operator and nothing else
	object bool // the value is nested, a dictionary
	nested []dictField
}

// parseDictFormat compiles a format dictionary: a JSON object whose values
// are format strings or objects of the same kind, in its keys' order.
func parseDictFormat(s string) ([]dictField, error) {
	return parseDict([]byte(s), "")
}

func parseDict(obj []byte, path string) ([]dictField, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("%s: want a JSON object of format strings", pathOr(path))
	}
	var fields []dictField
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pathOr(path), err)
		}
		key := t.(string)
		at := path + "." + key
		if seen[key] {
			return nil, fmt.Errorf("%s: given twice", at[1:])
		}
		seen[key] = true
		f := dictField{key: string(rules.AppendJSONString(nil, key)) + ":"}
		if len(fields) > 0 {
			f.key = "," + f.key
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%s: %w", at[1:], err)
		}
		var v string
		switch {
		case raw[0] == '{':
			if f.nested, err = parseDict(raw, at); err != nil {
				return nil, err
			}
			f.object = true
		case json.Unmarshal(raw, &v) == nil:
			if f.value, err = parseFormat(v); err != nil {
				return nil, fmt.Errorf("%s: %w", at[1:], err)
			}
			f.typed = len(f.value) == 1 && f.value[0].lit == "" && f.value[0].op.kind != opNone
		default:
			return nil, fmt.Errorf("%s: want a format string or an object", at[1:])
		}
		fields = append(fields, f)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%s: %w", pathOr(path), err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%s: text after the object", pathOr(path))
	}
	return fields, nil
}

func pathOr(path string) string {
	if path == "" {
		return "the format"
	}
	return path[1:]
}

// logLine is what a line is rendered from.
type logLine struct {
	r          *http.Request
	e          *accessEntry
	start, end time.Time
	received   int64
	status     int
	flags      string
}

// render appends the line for l to b, using scratch (returned grown) for
// values that are escaped as JSON.
func (f *accessFormat) render(b, scratch []byte, l *logLine) ([]byte, []byte) {
	if !f.isDict {
		return appendParts(b, f.text, l), scratch
	}
	b, scratch = appendDict(b, scratch, f.dict, l)
	return append(b, '\n'), scratch
}

func appendParts(b []byte, parts []fmtPart, l *logLine) []byte {
	for i := range parts {
		p := &parts[i]
		b = append(b, p.lit...)
		if p.op.kind == opNone {
			continue
		}
		var ok bool
		if b, ok = p.op.append(b, l); !ok {
			b = append(b, '-') // as Envoy prints a value it does not have
		}
	}
	return b
}

func appendDict(b, scratch []byte, fields []dictField, l *logLine) ([]byte, []byte) {
	b = append(b, '{')
	for i := range fields {
		f := &fields[i]
		b = append(b, f.key...)
		switch {
		case f.object:
			b, scratch = appendDict(b, scratch, f.nested, l)
		case f.typed:
			op := &f.value[0].op
			var ok bool
			if scratch, ok = op.append(scratch[:0], l); !ok {
				b = append(b, "null"...)
			} else if op.kind.numeric() {
				b = append(b, scratch...)
			} else {
				b = rules.AppendJSONBytes(b, scratch)
			}
		default:
			scratch = appendParts(scratch[:0], f.value, l)
			b = rules.AppendJSONBytes(b, scratch)
		}
	}
	return append(b, '}'), scratch
}

// append appends op's value for l to b, and reports whether there was one.
func (op *fmtOp) append(b []byte, l *logLine) ([]byte, bool) {
	r := l.r
	switch op.kind {
	case opStartTime:
		return appendTime(b, l.start, op.timeLayout), true
	case opReq, opResp:
		v := op.header(l, op.name)
		if v == "" && op.alt != "" {
			v = op.header(l, op.alt)
		}
		if v == "" {
			return b, false
		}
		if op.max > 0 && len(v) > op.max {
			v = v[:op.max]
		}
		return append(b, v...), true
	case opProtocol:
		return append(b, wasmhost.ProtocolName(r)...), true
	case opResponseCode:
		return strconv.AppendInt(b, int64(l.status), 10), true
	case opResponseFlags:
		return appendValue(b, l.flags)
	case opBytesReceived:
		return strconv.AppendInt(b, l.received, 10), true
	case opBytesSent:
		return strconv.AppendInt(b, l.e.sent, 10), true
	case opDuration:
		return strconv.AppendInt(b, l.end.Sub(l.start).Milliseconds(), 10), true
	case opUpstreamHost:
		return appendValue(b, l.e.upstream)
	case opRemoteAddress:
		return appendValue(b, r.RemoteAddr)
	case opRemoteAddressNoPort, opRemotePort:
		host, port, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			return b, false
		}
		if op.kind == opRemotePort {
			return appendValue(b, port)
		}
		return appendValue(b, host)
	case opLocalAddress, opLocalAddressNoPort, opLocalPort:
		a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
		if !ok {
			return b, false
		}
		ap := a.AddrPort()
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		switch op.kind {
		case opLocalAddressNoPort:
			return ap.Addr().AppendTo(b), true
		case opLocalPort:
			return strconv.AppendUint(b, uint64(ap.Port()), 10), true
		}
		return ap.AppendTo(b), true
	case opHostname:
		return appendValue(b, hostname)
	}
	return b, false
}

func appendValue(b []byte, s string) ([]byte, bool) {
	if s == "" {
		return b, false
	}
	return append(b, s...), true
}

// header is the request's (REQ) or the answer's (RESP) header key, the
// request's pseudo headers as Envoy has them.
func (op *fmtOp) header(l *logLine, key string) string {
	r := l.r
	if op.kind == opResp {
		return headerValue(l.e.Header(), key)
	}
	switch key {
	case ":method":
		return r.Method
	case ":path":
		if strings.HasPrefix(r.RequestURI, "/") {
			return r.RequestURI
		}
		return r.URL.RequestURI() // absolute form: its path, as Envoy's :path
	case ":authority":
		return r.Host
	case ":scheme":
		if r.TLS != nil {
			return "https"
		}
		return "http"
	}
	return headerValue(r.Header, key)
}

// hostname is HOSTNAME's value: the machine's name, read once.
var hostname, _ = os.Hostname()

// accessFormatFrom is the access log format the flags ask for: text,
// json (a format dictionary) or neither (Envoy's default).
func accessFormatFrom(text, dict string) (*accessFormat, error) {
	switch {
	case text != "" && dict != "":
		return nil, errors.New("--access-log-format and --access-log-json: give one or neither")
	case dict != "":
		d, err := parseDictFormat(dict)
		if err != nil {
			return nil, fmt.Errorf("--access-log-json: %w", err)
		}
		return &accessFormat{dict: d, isDict: true}, nil
	case text != "":
		t, err := parseTextFormat(text)
		if err != nil {
			return nil, fmt.Errorf("--access-log-format: %w", err)
		}
		return &accessFormat{text: t}, nil
	}
	return &accessFormat{text: defaultAccessParts}, nil
}

// defaultAccessParts is defaultAccessFormat compiled; a test checks that
// it compiles.
var defaultAccessParts, _ = parseTextFormat(defaultAccessFormat)
