package rls

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
)

// The JSON form of ShouldRateLimit, as envoyproxy/ratelimit serves it on
// its HTTP port (POST /json): the request and the answer in protobuf's
// JSON mapping. Field names are accepted in both their JSON (lowerCamel)
// and proto (snake_case) spelling, numbers as numbers or strings, enums
// by name or number, null as the field's default; an unknown field is
// refused, as protobuf's JSON parser refuses it.

// JSONError is a JSON request refused: the field at fault, as a path
// ("descriptors[1].limit.unit"; "body" when the body is not a JSON
// object), and why.
type JSONError struct{ Field, Reason string }

func (e *JSONError) Error() string { return e.Field + ": " + e.Reason }

// fieldError is a JSONError for the field at path.
func fieldError(path, format string, args ...any) error {
	return &JSONError{Field: path, Reason: fmt.Sprintf(format, args...)}
}

// unitNames are the names of envoy.type.v3.RateLimitUnit and of
// RateLimitResponse.RateLimit.Unit, which share their numbers.
var unitNames = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

// DecodeJSONRequest reads a RateLimitRequest in protobuf's JSON mapping
// into req (its Descriptors reused). Its error is a *JSONError.
func DecodeJSONRequest(body []byte, req *Request) error {
	*req = Request{Descriptors: req.Descriptors[:0]}
	if !gjson.ValidBytes(body) {
		return &JSONError{Field: "body", Reason: "not JSON"}
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return &JSONError{Field: "body", Reason: "not a JSON object"}
	}
	return eachField(root, "", func(name, path string, v gjson.Result) error {
		switch name {
		case "domain":
			return jsonString(v, path, &req.Domain)
		case "hitsAddend", "hits_addend":
			n, err := jsonUint(v, path, math.MaxUint32)
			req.HitsAddend = uint32(n)
			return err
		case "descriptors":
			if !v.IsArray() {
				return fieldError(path, "want a list")
			}
			for i, d := range v.Array() {
				req.Descriptors = append(req.Descriptors, Descriptor{})
				if err := decodeJSONDescriptor(d, fmt.Sprintf("%s[%d]", path, i), &req.Descriptors[i]); err != nil {
					return err
				}
			}
			return nil
		}
		return fieldError(path, "unknown field")
	})
}

func decodeJSONDescriptor(v gjson.Result, path string, d *Descriptor) error {
	if !v.IsObject() {
		return fieldError(path, "want an object")
	}
	return eachField(v, path+".", func(name, path string, v gjson.Result) error {
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
				err := eachField(e, p+".", func(name, path string, v gjson.Result) error {
					switch name {
					case "key":
						return jsonString(v, path, &entry.Key)
					case "value":
						return jsonString(v, path, &entry.Value)
					}
					return fieldError(path, "unknown field")
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
			return eachField(v, path+".", func(name, path string, v gjson.Result) error {
				switch name {
				case "requestsPerUnit", "requests_per_unit":
					n, err := jsonUint(v, path, math.MaxUint32)
					o.RequestsPerUnit = uint32(n)
					return err
				case "unit":
					return jsonUnit(v, path, &o.Unit)
				case "unitMultiplier", "unit_multiplier":
					n, err := jsonUint(v, path, math.MaxUint32)
					o.UnitMultiplier, o.HasUnitMultiplier = uint32(n), true
					return err
				}
				return fieldError(path, "unknown field")
			})
		case "hitsAddend", "hits_addend":
			n, err := jsonUint(v, path, math.MaxUint64)
			d.HitsAddend, d.HasHitsAddend = n, true
			return err
		case "isNegativeHits", "is_negative_hits":
			if v.Type != gjson.True && v.Type != gjson.False {
				return fieldError(path, "want true or false")
			}
			d.NegativeHits = v.Bool()
			return nil
		}
		return fieldError(path, "unknown field")
	})
}

// eachField calls f with each field of the object v that is not null
// (protobuf's JSON mapping reads null as the field's default), its name
// and its path (prefix and name).
func eachField(v gjson.Result, prefix string, f func(name, path string, v gjson.Result) error) error {
	var err error
	v.ForEach(func(k, v gjson.Result) bool {
		if v.Type != gjson.Null {
			err = f(k.Str, prefix+k.Str, v)
		}
		return err == nil
	})
	return err
}

func jsonString(v gjson.Result, path string, s *string) error {
	if v.Type != gjson.String {
		return fieldError(path, "want a string")
	}
	*s = v.Str
	return nil
}

// jsonUint reads an unsigned integer up to max: a JSON number with no
// fraction, or a string of one, as protobuf's JSON mapping writes 64-bit
// numbers.
func jsonUint(v gjson.Result, path string, max uint64) (uint64, error) {
	raw := v.Raw
	if v.Type == gjson.String {
		raw = v.Str
	} else if v.Type != gjson.Number {
		return 0, fieldError(path, "want a number")
	}
	n, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		// An exponent or a fraction of zero, as in 1e3 or 5.0.
		f, ferr := strconv.ParseFloat(raw, 64)
		if ferr != nil || f < 0 || f != math.Trunc(f) || f > float64(max) {
			return 0, fieldError(path, "want an integer from 0 to %d", max)
		}
		n = uint64(f)
	}
	if n > max {
		return 0, fieldError(path, "want an integer from 0 to %d", max)
	}
	return n, nil
}

// jsonUnit reads a RateLimitUnit by name or number.
func jsonUnit(v gjson.Result, path string, u *Unit) error {
	if v.Type == gjson.String {
		for i, name := range unitNames {
			if v.Str == name {
				*u = Unit(i)
				return nil
			}
		}
		// A number in a string is a number, as for any integer.
		if _, err := strconv.ParseUint(v.Str, 10, 32); err != nil {
			return fieldError(path, "%q is not one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR", v.Str)
		}
	}
	n, err := jsonUint(v, path, math.MaxInt32)
	*u = Unit(n)
	return err
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
			if int(l.Unit) < len(unitNames) {
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
