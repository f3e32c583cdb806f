package rls

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The service's messages (envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto) are read and
// written here field by field: the generated types would bring Envoy's
// whole proto graph into the bridge (18 MB more binary) for five small
// messages. The tests hold this code to the generated types.

// Request is a ShouldRateLimit request (RateLimitRequest).
type Request struct {
	Domain      string
	Descriptors []Descriptor
	HitsAddend  uint32 // 0: 1
}

// Descriptor is one of a request's descriptors (RateLimitDescriptor).
type Descriptor struct {
	Entries []Entry
	// Override is the limit the caller gives (limit), nil when none.
	Override *Override
	// HitsAddend is the descriptor's own hits_addend, when HasHitsAddend.
	HitsAddend    uint64
	HasHitsAddend bool
	NegativeHits  bool // is_negative_hits
}

// Override is a descriptor's RateLimitOverride.
type Override struct {
	RequestsPerUnit uint32
	Unit            Unit
	// UnitMultiplier is how many units the window lasts, when
	// HasUnitMultiplier (a value of 0 is the caller's error).
	UnitMultiplier    uint32
	HasUnitMultiplier bool
}

var (
	errTruncated = errors.New("truncated or malformed protobuf")
	errUTF8      = errors.New("a string field is not valid UTF-8")
)

// DecodeRequest reads a RateLimitRequest as protobuf's rules read it:
// fields in any order, unknown ones skipped, the last of a scalar field
// winning, a message field given twice merged.
func DecodeRequest(b []byte, r *Request) error {
	*r = Request{}
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return utf8String(v, &r.Domain)
		case num == 2 && typ == protowire.BytesType:
			var d Descriptor
			if err := decodeDescriptor(v, &d); err != nil {
				return err
			}
			r.Descriptors = append(r.Descriptors, d)
		case num == 3 && typ == protowire.VarintType:
			r.HitsAddend = uint32(n)
		}
		return nil
	})
}

func decodeDescriptor(b []byte, d *Descriptor) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			var e Entry
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					return utf8String(v, &e.Key)
				case num == 2 && typ == protowire.BytesType:
					return utf8String(v, &e.Value)
				}
				return nil
			}); err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case num == 2 && typ == protowire.BytesType:
			if d.Override == nil {
				d.Override = &Override{}
			}
			o := d.Override
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
				switch {
				case num == 1 && typ == protowire.VarintType:
					o.RequestsPerUnit = uint32(n)
				case num == 2 && typ == protowire.VarintType:
					o.Unit = Unit(int32(n))
				case num == 3 && typ == protowire.BytesType: // google.protobuf.UInt32Value
					o.HasUnitMultiplier = true
					return fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
						if num == 1 && typ == protowire.VarintType {
							o.UnitMultiplier = uint32(n)
						}
						return nil
					})
				}
				return nil
			})
		case num == 3 && typ == protowire.BytesType: // google.protobuf.UInt64Value
			d.HasHitsAddend = true
			return fields(v, func(num protowire.Number, typ protowire.Type, _ []byte, n uint64) error {
				if num == 1 && typ == protowire.VarintType {
					d.HitsAddend = n
				}
				return nil
			})
		case num == 4 && typ == protowire.VarintType:
			d.NegativeHits = n != 0
		}
		return nil
	})
}

// fields calls f with each field of the message b: its number, its wire
// type, and its bytes (length-delimited) or value (varint, fixed). A
// field of a known number with another wire type is skipped, as protobuf
// skips what it cannot place.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || !num.IsValid() {
			return errTruncated
		}
		b = b[n:]
		var (
			v   []byte
			val uint64
		)
		switch typ {
		case protowire.VarintType:
			val, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		if typ != protowire.VarintType && typ != protowire.BytesType {
			continue
		}
		if err := f(num, typ, v, val); err != nil {
			return err
		}
	}
	return nil
}

func utf8String(v []byte, dst *string) error {
	if !utf8.Valid(v) {
		return errUTF8
	}
	*dst = string(v)
	return nil
}

// Code is a RateLimitResponse.Code.
type Code int32

// The codes.
const (
	CodeOK        Code = 1
	CodeOverLimit Code = 2
)

// Status is a descriptor's answer (RateLimitResponse.DescriptorStatus).
type Status struct {
	Code Code
	// Limit is the descriptor's limit (current_limit); nil when it has
	// none, and then nothing below is written.
	Limit     *Limit
	Remaining uint32
	// UntilReset is the time to the limit's next window.
	UntilReset time.Duration
}

// headerNames are the names of the RateLimit headers: HeaderNames, or
// DefaultHeaderNames.
func (r *Response) headerNames() [3]string {
	if r.HeaderNames[0] == "" {
		return DefaultHeaderNames
	}
	return r.HeaderNames
}

// resetSeconds is the time to the reset in whole seconds, rounded up, as
// the RateLimit-Reset header says it.
func (s *Status) resetSeconds() int64 { return int64((s.UntilReset + time.Second - 1) / time.Second) }

// Response is a ShouldRateLimit answer (RateLimitResponse).
type Response struct {
	Overall  Code
	Statuses []Status
	// Headers is the status whose RateLimit headers the answer adds (one
	// of Statuses, with a limit); nil: none.
	Headers *Status
	// HeaderNames names them: limit, remaining, reset; empty, the default
	// ones (DefaultHeaderNames).
	HeaderNames [3]string
	// Metadata is the answer's dynamic_metadata; nil: none.
	Metadata *Metadata
}

// DefaultHeaderNames are the RateLimit headers' names, as
// envoyproxy/ratelimit's are by default: limit, remaining, reset.
var DefaultHeaderNames = [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// Metadata is an answer's dynamic metadata as envoyproxy/ratelimit makes
// it (RESPONSE_DYNAMIC_METADATA): the request's domain, descriptors and
// hits_addend, and the configured metadata of its limits that were not
// over, merged.
type Metadata struct {
	Request *Request
	// Merged is the limits' metadata merged: values as the configuration
	// holds them (json.Number for numbers).
	Merged map[string]any
}

// AppendResponse appends the RateLimitResponse r.
func AppendResponse(b []byte, r *Response) []byte {
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(r.Overall))
	for i := range r.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = appendMessage(b, func(b []byte) []byte { return appendStatus(b, &r.Statuses[i]) })
	}
	if m := r.Metadata; m != nil {
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		b = appendMessage(b, func(b []byte) []byte { return appendStruct(b, m.fields()) })
	}
	if h := r.Headers; h != nil {
		names := r.headerNames()
		b = appendHeader(b, names[0], h.Limit.RequestsPerUnit)
		b = appendHeader(b, names[1], int64(h.Remaining))
		b = appendHeader(b, names[2], h.resetSeconds())
	}
	return b
}

// fields are the metadata's fields, as a Struct holds them.
func (m *Metadata) fields() map[string]any {
	r := m.Request
	ds := make([]any, len(r.Descriptors))
	for i := range r.Descriptors {
		d := &r.Descriptors[i]
		entries := make([]any, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = e.Key + "=" + e.Value
		}
		f := map[string]any{"entries": entries}
		if o := d.Override; o != nil {
			// The override in protobuf's text format, as there.
			limit := fmt.Sprintf("requests_per_unit:%d unit:%s", o.RequestsPerUnit, strings.ToUpper(o.Unit.String()))
			if o.HasUnitMultiplier {
				limit += fmt.Sprintf(" unit_multiplier:{value:%d}", o.UnitMultiplier)
			}
			f["limit"] = limit
		}
		if d.HasHitsAddend {
			f["hitsAddend"] = float64(d.HitsAddend)
		}
		ds[i] = f
	}
	f := map[string]any{"domain": r.Domain, "descriptors": ds}
	if r.HitsAddend != 0 {
		f["hitsAddend"] = float64(r.HitsAddend)
	}
	if len(m.Merged) > 0 {
		f["metadata"] = m.Merged
	}
	return f
}

// MergeMetadata merges src into dst, as envoyproxy/ratelimit merges the
// metadata of a call's limits: a field dst lacks is added, two mappings
// are merged, and otherwise dst's value stays. dst's mappings are copied
// before they change, so src and dst may share them (configurations do).
func MergeMetadata(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = map[string]any{}
	}
	for k, v := range src {
		old, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		om, ok1 := old.(map[string]any)
		vm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			dst[k] = MergeMetadata(maps.Clone(om), vm)
		}
	}
	return dst
}

// appendStruct appends the fields of a google.protobuf.Struct, in order
// of name.
func appendStruct(b []byte, fields map[string]any) []byte {
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		b = protowire.AppendTag(b, 1, protowire.BytesType) // map<string, Value> entry
		b = appendMessage(b, func(b []byte) []byte {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			return appendMessage(b, func(b []byte) []byte { return appendValue(b, fields[k]) })
		})
	}
	return b
}

// appendValue appends the fields of the google.protobuf.Value of v, a
// value of a JSON document (json.Number for numbers) or a float64; any
// other is null.
func appendValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case json.Number:
		f, _ := v.Float64() // out of range: ±Inf, as a JSON parser reads it
		return appendValue(b, f)
	case float64:
		b = protowire.AppendTag(b, 2, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v))
	case string:
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		return protowire.AppendString(b, v)
	case bool:
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		return protowire.AppendVarint(b, protowire.EncodeBool(v))
	case map[string]any:
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		return appendMessage(b, func(b []byte) []byte { return appendStruct(b, v) })
	case []any:
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		return appendMessage(b, func(b []byte) []byte {
			for _, x := range v {
				b = protowire.AppendTag(b, 1, protowire.BytesType)
				b = appendMessage(b, func(b []byte) []byte { return appendValue(b, x) })
			}
			return b
		})
	}
	b = protowire.AppendTag(b, 1, protowire.VarintType) // null_value
	return protowire.AppendVarint(b, 0)
}

// appendHeader appends a response_headers_to_add of name and the value v
// (config.core.v3.HeaderValue).
func appendHeader(b []byte, name string, v int64) []byte {
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	return appendMessage(b, func(b []byte) []byte {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, name)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		return appendMessage(b, func(b []byte) []byte { return strconv.AppendInt(b, v, 10) })
	})
}

func appendStatus(b []byte, s *Status) []byte {
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(s.Code))
	if s.Limit != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = appendMessage(b, func(b []byte) []byte {
			if rpu := uint32(min(s.Limit.RequestsPerUnit, 1<<32-1)); rpu != 0 {
				b = protowire.AppendTag(b, 1, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(rpu))
			}
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(s.Limit.Unit))
			if s.Limit.Name != "" {
				b = protowire.AppendTag(b, 3, protowire.BytesType)
				b = protowire.AppendString(b, s.Limit.Name)
			}
			if m := s.Limit.UnitMultiplier; m > 1 {
				b = protowire.AppendTag(b, 4, protowire.BytesType) // google.protobuf.UInt32Value
				b = appendMessage(b, func(b []byte) []byte {
					b = protowire.AppendTag(b, 1, protowire.VarintType)
					return protowire.AppendVarint(b, uint64(m))
				})
			}
			return b
		})
	}
	// Without a limit too: an unlimited descriptor's remaining is the
	// largest uint32, as envoyproxy/ratelimit gives it.
	if s.Remaining != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(s.Remaining))
	}
	if s.Limit == nil {
		return b
	}
	b = protowire.AppendTag(b, 4, protowire.BytesType) // google.protobuf.Duration
	return appendMessage(b, func(b []byte) []byte {
		if sec := int64(s.UntilReset / time.Second); sec != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(sec))
		}
		if nanos := int32(s.UntilReset % time.Second); nanos != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(nanos)))
		}
		return b
	})
}

// appendMessage appends the length-delimited message body writes.
func appendMessage(b []byte, body func([]byte) []byte) []byte {
	start := len(b)
	b = body(b)
	size := len(b) - start
	// The length goes before the body, which is written first: make room
	// for the length, move the body after it, and put the length in.
	var tmp [binary.MaxVarintLen64]byte
	lb := protowire.AppendVarint(tmp[:0], uint64(size))
	b = append(b, lb...)
	copy(b[start+len(lb):], b[start:start+size])
	copy(b[start:], lb)
	return b
}

// The gRPC health service's messages (grpc.health.v1), which Envoy's
// grpc_health_check sends to the service's cluster.

// Health is a HealthCheckResponse's serving status.
type Health int32

// The statuses the bridge answers.
const (
	Serving    Health = 1
	NotServing Health = 2
)

// DecodeHealthRequest reads a HealthCheckRequest: the service asked about
// ("" for the server as a whole).
func DecodeHealthRequest(b []byte) (service string, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num == 1 && typ == protowire.BytesType {
			return utf8String(v, &service)
		}
		return nil
	})
	return service, err
}

// AppendHealthResponse appends the HealthCheckResponse of h.
func AppendHealthResponse(b []byte, h Health) []byte {
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(h))
}
