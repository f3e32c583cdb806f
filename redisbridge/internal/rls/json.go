package rls

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// The JSON form of ShouldRateLimit, as envoyproxy/ratelimit serves it on
// its HTTP port (POST /json): the request and the answer in protobuf's
// JSON mapping. A request is read as protobuf's JSON parser reads it,
// which is what envoyproxy/ratelimit answers with, so that a caller sees
// the same message accepted or refused by either: field names in
// lowerCamel or as in the proto, each at most once; integers as numbers
// or strings of one, with a fraction or exponent when the value is whole
// (read exactly, not through a float); enums by name or number; null as
// the field's default; strings valid UTF-8; an unknown field refused.

// JSONError is a JSON request refused: the field at fault, as a path
// ("descriptors[1].limit.unit"; "body" when the body is not a JSON
// object), and why.
type JSONError struct{ Field, Reason string }

func (e *JSONError) Error() string { return e.Field + ": " + e.Reason }

// fieldError is a JSONError for the field at path.
func fieldError(path, format string, args ...any) error {
	return &JSONError{Field: path, Reason: fmt.Sprintf(format, args...)}
}

// unitNames are the names of RateLimitResponse.RateLimit.Unit, by number.
// A request's override has envoy.type.v3.RateLimitUnit, which shares the
// numbers but has no WEEK: requestUnitNames.
var (
	unitNames        = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}
	requestUnitNames = unitNames[:7]
)

// jsonFields are a message's fields by their two JSON names, lowerCamel
// and as in the proto.
type jsonFields [][2]string

var (
	requestFields    = jsonFields{{"domain", "domain"}, {"descriptors", "descriptors"}, {"hitsAddend", "hits_addend"}}
	descriptorFields = jsonFields{{"entries", "entries"}, {"limit", "limit"}, {"hitsAddend", "hits_addend"}, {"isNegativeHits", "is_negative_hits"}}
	entryFields      = jsonFields{{"key", "key"}, {"value", "value"}}
	overrideFields   = jsonFields{{"requestsPerUnit", "requests_per_unit"}, {"unit", "unit"}, {"unitMultiplier", "unit_multiplier"}}
)

// DecodeJSONRequest reads a RateLimitRequest in protobuf's JSON mapping
// into req (its Descriptors reused). Its error is a *JSONError.
func DecodeJSONRequest(body []byte, req *Request) error {
	*req = Request{Descriptors: req.Descriptors[:0]}
	if !gjson.ValidBytes(body) {
		return &JSONError{Field: "body", Reason: "not JSON"}
	}
	if !utf8.Valid(body) || !validEscapes(body) {
		return &JSONError{Field: "body", Reason: "a string is not valid UTF-8"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return &JSONError{Field: "body", Reason: "not a JSON object"}
	}
	return eachField(root, "", requestFields, func(name, path string, v gjson.Result) error {
		switch name {
		case "domain":
			return jsonString(v, path, &req.Domain)
		case "hitsAddend":
			n, err := jsonUint(v, path, math.MaxUint32)
			req.HitsAddend = uint32(n)
			return err
		}
		if !v.IsArray() { // descriptors
			return fieldError(path, "want a list")
		}
		for i, d := range v.Array() {
			req.Descriptors = append(req.Descriptors, Descriptor{})
			if err := decodeJSONDescriptor(d, fmt.Sprintf("%s[%d]", path, i), &req.Descriptors[len(req.Descriptors)-1]); err != nil {
				return err
			}
		}
		return nil
	})
}

func decodeJSONDescriptor(v gjson.Result, path string, d *Descriptor) error {
	if !v.IsObject() {
		return fieldError(path, "want an object")
	}
	return eachField(v, path+".", descriptorFields, func(name, path string, v gjson.Result) error {
		switch name {
		case "entries":
			if !v.IsArray() {
				return fieldError(path, "want a list")
			}
			for i, e := range v.Array() {
				p := fmt.Sprintf("%s[%d]", path, i)
				if !e.IsObject() {
					return fieldError(p, "want an object")
				}
				var entry Entry
				err := eachField(e, p+".", entryFields, func(name, path string, v gjson.Result) error {
					if name == "key" {
						return jsonString(v, path, &entry.Key)
					}
					return jsonString(v, path, &entry.Value)
				})
				if err != nil {
					return err
				}
				d.Entries = append(d.Entries, entry)
			}
			return nil
		case "limit":
			if !v.IsObject() {
				return fieldError(path, "want an object")
			}
			o := &Override{}
			d.Override = o
			return eachField(v, path+".", overrideFields, func(name, path string, v gjson.Result) error {
				switch name {
				case "requestsPerUnit":
					n, err := jsonUint(v, path, math.MaxUint32)
					o.RequestsPerUnit = uint32(n)
					return err
				case "unit":
					return jsonUnit(v, path, &o.Unit)
				}
				n, err := jsonUint(v, path, math.MaxUint32)
				o.UnitMultiplier, o.HasUnitMultiplier = uint32(n), true
				return err
			})
		case "hitsAddend":
			n, err := jsonUint(v, path, math.MaxUint64)
			d.HitsAddend, d.HasHitsAddend = n, true
			return err
		}
		if v.Type != gjson.True && v.Type != gjson.False { // isNegativeHits
			return fieldError(path, "want true or false")
		}
		d.NegativeHits = v.Bool()
		return nil
	})
}

// eachField calls f with each field of the object v that is not null
// (protobuf's JSON mapping reads null as the field's default): its
// lowerCamel name in fs, and its path (prefix and the name it came
// under). A name not in fs, or a field given twice (under either name,
// null or not), is refused.
func eachField(v gjson.Result, prefix string, fs jsonFields, f func(name, path string, v gjson.Result) error) error {
	var seen uint
	var err error
	v.ForEach(func(k, v gjson.Result) bool {
		path := prefix + k.Str
		i := slices.IndexFunc(fs, func(names [2]string) bool { return k.Str == names[0] || k.Str == names[1] })
		switch {
		case i < 0:
			err = fieldError(path, "unknown field")
		case seen&(1<<i) != 0:
			err = fieldError(path, "given twice")
		default:
			seen |= 1 << i
			if v.Type != gjson.Null {
				err = f(fs[i][0], path, v)
			}
		}
		return err == nil
	})
	return err
}

// validEscapes reports whether every \u escape in the valid JSON body
// that names a UTF-16 surrogate is the first half of a pair followed by
// its second half, as protobuf's JSON parser requires.
func validEscapes(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		i++ // the escaped character: in valid JSON there is one
		if body[i] != 'u' {
			continue
		}
		r := hexRune(body[i+1 : i+5])
		i += 4
		if !utf16.IsSurrogate(r) {
			continue
		}
		if i+6 >= len(body) || body[i+1] != '\\' || body[i+2] != 'u' ||
			utf16.DecodeRune(r, hexRune(body[i+3:i+7])) == utf8.RuneError {
			return false
		}
		i += 6
	}
	return true
}

// hexRune is the rune of four hex digits.
func hexRune(h []byte) rune {
	n, _ := strconv.ParseUint(string(h), 16, 16)
	return rune(n)
}

func jsonString(v gjson.Result, path string, s *string) error {
	if v.Type != gjson.String {
		return fieldError(path, "want a string")
	}
	*s = v.Str
	return nil
}

// jsonUint reads an unsigned integer up to max: a JSON number, or a
// string that is one and nothing else, as protobuf's JSON mapping writes
// 64-bit numbers.
func jsonUint(v gjson.Result, path string, max uint64) (uint64, error) {
	raw := v.Raw
	if v.Type == gjson.String {
		raw = v.Str
	} else if v.Type != gjson.Number {
		return 0, fieldError(path, "want a number")
	}
	s, ok := integerText(raw)
	n, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil || n > max {
		return 0, fieldError(path, "want an integer from 0 to %d", max)
	}
	return n, nil
}

// integerText returns the whole number the JSON number raw stands for in
// plain decimal ("-" first when negative; "12" for 1.2e1 and 120e-1), or
// false when raw is not exactly one JSON number or not a whole one. It
// works on the digits, not through a float, so that every uint64 reads
// exactly, and it refuses exponents that would make more than 20 digits,
// as protobuf's JSON parser does.
func integerText(raw string) (string, bool) {
	digits := func(s string) int {
		n := 0
		for n < len(s) && '0' <= s[n] && s[n] <= '9' {
			n++
		}
		return n
	}
	s := raw
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var intp, frac string
	switch n := digits(s); {
	case n == 0 || (s[0] == '0' && n > 1):
		return "", false
	case s[0] == '0':
		s = s[1:] // a leading zero adds nothing
	default:
		intp, s = s[:n], s[n:]
	}
	if len(s) >= 2 && s[0] == '.' {
		n := digits(s[1:])
		if n == 0 {
			return "", false
		}
		frac, s = strings.TrimRight(s[1:1+n], "0"), s[1+n:]
	}
	exp := 0
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		sign := 0
		if s[0] == '+' || s[0] == '-' {
			sign = 1
		}
		n := digits(s[sign:])
		e, err := strconv.ParseInt(s[:sign+n], 10, 32)
		if n == 0 || err != nil {
			return "", false
		}
		exp, s = int(e), s[sign+n:]
	}
	switch {
	case s != "":
		return "", false
	case intp == "" && frac == "":
		return "0", true
	}
	var num string
	if exp >= 0 {
		if len(frac) > exp || len(intp)+exp > 20 {
			return "", false
		}
		num = intp + frac + strings.Repeat("0", exp-len(frac))
	} else {
		at := len(intp) + exp // where the point goes
		if frac != "" || at < 0 || strings.Trim(intp[at:], "0") != "" {
			return "", false
		}
		num = intp[:at]
	}
	if neg {
		return "-" + num, true
	}
	return num, true
}

// jsonUnit reads a RateLimitUnit by name, or by number as a JSON number
// (any int32: protobuf's enums are open; 7 is a week, as over gRPC).
func jsonUnit(v gjson.Result, path string, u *Unit) error {
	switch v.Type {
	case gjson.String:
		if i := slices.Index(requestUnitNames, v.Str); i >= 0 {
			*u = Unit(i)
			return nil
		}
		return fieldError(path, "%q is not one of SECOND, MINUTE, HOUR, DAY, MONTH, YEAR", v.Str)
	case gjson.Number:
		s, ok := integerText(v.Raw)
		n, err := strconv.ParseInt(s, 10, 32)
		if ok && err == nil {
			*u = Unit(n)
			return nil
		}
	}
	return fieldError(path, "want a unit's name or an integer from %d to %d", math.MinInt32, math.MaxInt32)
}

// AppendResponseJSON appends the RateLimitResponse r in protobuf's JSON
// mapping: fields named in lowerCamel, those at their default left out,
// enums by name, durations as seconds ("1.5s").
func AppendResponseJSON(b []byte, r *Response) []byte {
	b = append(b, `{"overallCode":`...)
	b = appendCodeJSON(b, r.Overall)
	if len(r.Statuses) > 0 {
		b = append(b, `,"statuses":[`...)
		for i := range r.Statuses {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendStatusJSON(b, &r.Statuses[i])
		}
		b = append(b, ']')
	}
	if h := r.Headers; h != nil {
		names := r.headerNames()
		b = append(b, `,"responseHeadersToAdd":[`...)
		for i, v := range [3]int64{h.Limit.RequestsPerUnit, int64(h.Remaining), h.resetSeconds()} {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"key":`...)
			b = appendJSONString(b, names[i])
			b = append(b, `,"value":`...)
			b = appendJSONString(b, strconv.FormatInt(v, 10))
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if m := r.Metadata; m != nil {
		b = append(b, `,"dynamicMetadata":`...)
		js, err := json.Marshal(m.fields())
		if err != nil { // the fields are strings, numbers, lists and maps
			js = []byte("{}")
		}
		b = append(b, js...)
	}
	return append(b, '}')
}

func appendStatusJSON(b []byte, s *Status) []byte {
	b = append(b, `{"code":`...)
	b = appendCodeJSON(b, s.Code)
	if l := s.Limit; l != nil {
		b = append(b, `,"currentLimit":{`...)
		comma := false
		if rpu := uint32(min(l.RequestsPerUnit, 1<<32-1)); rpu != 0 {
			b = strconv.AppendUint(append(b, `"requestsPerUnit":`...), uint64(rpu), 10)
			comma = true
		}
		if l.Unit != 0 {
			if comma {
				b = append(b, ',')
			}
			b = append(b, `"unit":`...)
			if l.Unit > 0 && int(l.Unit) < len(unitNames) {
				b = appendJSONString(b, unitNames[l.Unit])
			} else {
				b = strconv.AppendInt(b, int64(l.Unit), 10)
			}
			comma = true
		}
		if l.Name != "" {
			if comma {
				b = append(b, ',')
			}
			b = appendJSONString(append(b, `"name":`...), l.Name)
			comma = true
		}
		if l.UnitMultiplier > 1 {
			if comma {
				b = append(b, ',')
			}
			b = strconv.AppendUint(append(b, `"unitMultiplier":`...), uint64(l.UnitMultiplier), 10)
		}
		b = append(b, '}')
	}
	if s.Remaining != 0 {
		b = strconv.AppendUint(append(b, `,"limitRemaining":`...), uint64(s.Remaining), 10)
	}
	if s.Limit != nil {
		b = appendDurationJSON(append(b, `,"durationUntilReset":`...), s.UntilReset)
	}
	return append(b, '}')
}

func appendCodeJSON(b []byte, c Code) []byte {
	switch c {
	case CodeOK:
		return append(b, `"OK"`...)
	case CodeOverLimit:
		return append(b, `"OVER_LIMIT"`...)
	}
	return append(b, `"UNKNOWN"`...)
}

// appendDurationJSON appends d as protobuf's JSON mapping writes a
// Duration: seconds, with 0, 3, 6 or 9 digits of fraction.
func appendDurationJSON(b []byte, d time.Duration) []byte {
	b = append(b, '"')
	b = strconv.AppendInt(b, int64(d/time.Second), 10)
	if ns := int64(d % time.Second); ns != 0 {
		frac := strconv.AppendInt(nil, 1_000_000_000+ns, 10)[1:] // nine digits
		switch {
		case ns%1_000_000 == 0:
			frac = frac[:3]
		case ns%1_000 == 0:
			frac = frac[:6]
		}
		b = append(append(b, '.'), frac...)
	}
	return append(b, `s"`...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	js, _ := json.Marshal(s) // a string always marshals
	return append(b, js...)
}
