package rls

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// XDSTypeURL is the type of the resources in which an xDS management
// server gives the service its configuration, as it gives it to
// envoyproxy/ratelimit (CONFIG_TYPE=GRPC_XDS_SOTW):
// ratelimit.config.ratelimit.v3.RateLimitConfig, one per domain (or per
// part of one, with merge), the fields of a configuration file.
const XDSTypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// ParseXDS reads the RateLimitConfig resources of an xDS response into a
// configuration, as Parse reads files: each is the file its fields would
// be, named "xds:" and the resource's name, and an error names it and the
// field at fault. As envoyproxy/ratelimit reads them, a rate limit's
// requests_per_unit is 0 when the resource leaves it out, and a unit of
// UNKNOWN is none.
func ParseXDS(resources [][]byte, merge bool) (*Config, error) {
	docs := make(map[string]func() (map[string]any, error), len(resources))
	for i, r := range resources {
		name, tree, err := decodeXDSConfig(r)
		key := "xds:" + name
		if name == "" {
			key = fmt.Sprintf("xds:#%d", i)
		}
		if _, dup := docs[key]; dup {
			return nil, fmt.Errorf("%s: two resources of that name", key)
		}
		docs[key] = func() (map[string]any, error) { return tree, err }
	}
	return build(docs, merge)
}

// decodeXDSConfig reads a RateLimitConfig (ratelimit/config/ratelimit/v3/
// rls_conf.proto) into its name and the tree readYAML would read from a
// file with the same fields.
func decodeXDSConfig(b []byte) (string, map[string]any, error) {
	var name, domain string
	var descriptors []any
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return utf8String(v, &name)
		case num == 2 && typ == protowire.BytesType:
			return utf8String(v, &domain)
		case num == 3 && typ == protowire.BytesType:
			d, err := decodeXDSDescriptor(v)
			if err != nil {
				return err
			}
			descriptors = append(descriptors, d)
		}
		return nil
	})
	if err != nil {
		return name, nil, err
	}
	top := map[string]any{"domain": domain}
	if descriptors != nil {
		top["descriptors"] = descriptors
	}
	return name, top, nil
}

// decodeXDSDescriptor reads a RateLimitDescriptor. A field left at its
// zero value is left out, as protobuf does not tell it from one not
// given; a rate_limit or metadata given twice is merged, as protobuf
// merges a message field.
func decodeXDSDescriptor(b []byte) (map[string]any, error) {
	d := map[string]any{"key": ""}
	var children []any
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		var text string
		switch {
		case num == 1 && typ == protowire.BytesType:
			if err := utf8String(v, &text); err != nil {
				return err
			}
			d["key"] = text
		case num == 2 && typ == protowire.BytesType:
			if err := utf8String(v, &text); err != nil {
				return err
			}
			setText(d, "value", text)
		case num == 3 && typ == protowire.BytesType:
			rl, _ := d["rate_limit"].(map[string]any)
			if rl == nil {
				rl = map[string]any{}
				d["rate_limit"] = rl
			}
			return decodeXDSPolicy(v, rl)
		case num == 4 && typ == protowire.BytesType:
			c, err := decodeXDSDescriptor(v)
			if err != nil {
				return err
			}
			children = append(children, c)
		case num >= 5 && num <= 7 && typ == protowire.VarintType:
			setTrue(d, [...]string{"shadow_mode", "detailed_metric", "quota_mode"}[num-5], n != 0)
		case num == 8 && typ == protowire.BytesType: // google.protobuf.Struct
			m, _ := d["metadata"].(map[string]any)
			if m == nil {
				m = map[string]any{}
				d["metadata"] = m
			}
			return decodeStruct(v, m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if children != nil {
		d["descriptors"] = children
	}
	if rl, ok := d["rate_limit"].(map[string]any); ok {
		// requests_per_unit is a number whether given or not, unless the
		// limit is unlimited; unit UNKNOWN (0) is no unit.
		if u, _ := rl["unit"].(Unit); u != 0 {
			rl["unit"] = u.String()
		} else {
			delete(rl, "unit")
		}
		if _, ok := rl["requests_per_unit"]; !ok && rl["unlimited"] != true {
			rl["requests_per_unit"] = json.Number("0")
		}
	}
	return d, nil
}

// decodeXDSPolicy reads a RateLimitPolicy into rl; its unit stays a Unit
// until the descriptor is read whole.
func decodeXDSPolicy(b []byte, rl map[string]any) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, n uint64) error {
		var text string
		switch {
		case num == 1 && typ == protowire.VarintType:
			rl["unit"] = Unit(int32(n))
		case num == 2 && typ == protowire.VarintType:
			if uint32(n) == 0 {
				delete(rl, "requests_per_unit")
			} else {
				rl["requests_per_unit"] = json.Number(strconv.FormatUint(uint64(uint32(n)), 10))
			}
		case num == 3 && typ == protowire.VarintType:
			setTrue(rl, "unlimited", n != 0)
		case num == 4 && typ == protowire.BytesType:
			if err := utf8String(v, &text); err != nil {
				return err
			}
			setText(rl, "name", text)
		case num == 5 && typ == protowire.BytesType: // RateLimitReplace
			var r string
			if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 1 && typ == protowire.BytesType {
					return utf8String(v, &r)
				}
				return nil
			}); err != nil {
				return err
			}
			list, _ := rl["replaces"].([]any)
			rl["replaces"] = append(list, map[string]any{"name": r})
		}
		return nil
	})
}

// setText sets field to s, or leaves it out for "" (proto3's default).
func setText(m map[string]any, field, s string) {
	if s == "" {
		delete(m, field)
		return
	}
	m[field] = s
}

// setTrue sets field to true, or leaves it out for false.
func setTrue(m map[string]any, field string, b bool) {
	if !b {
		delete(m, field)
		return
	}
	m[field] = true
}

// decodeStruct reads a google.protobuf.Struct's fields into m, each value
// as readYAML gives metadata: numbers as json.Number, finite ones only.
func decodeStruct(b []byte, m map[string]any) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var key string
		var val any
		if err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				return utf8String(v, &key)
			case num == 2 && typ == protowire.BytesType:
				x, err := decodeValue(v)
				val = x
				return err
			}
			return nil
		}); err != nil {
			return err
		}
		m[key] = val
		return nil
	})
}

// decodeValue reads a google.protobuf.Value: of its kinds, the last
// given.
func decodeValue(b []byte) (any, error) {
	var val any
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, errTruncated
		}
		b = b[n:]
		if num == 2 && typ == protowire.Fixed64Type { // number_value: a fixed64, which fields skips
			bits, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return nil, errTruncated
			}
			b = b[n:]
			f := math.Float64frombits(bits)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, fmt.Errorf("metadata: %v is not a number a configuration may hold", f)
			}
			val = json.Number(strconv.FormatFloat(f, 'g', -1, 64))
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, errTruncated
		}
		v := b[:n]
		b = b[n:]
		var err error
		switch {
		case num == 1 && typ == protowire.VarintType: // null_value
			val = nil
		case num == 3 && typ == protowire.BytesType:
			var s string
			raw, _ := protowire.ConsumeBytes(v)
			err = utf8String(raw, &s)
			val = s
		case num == 4 && typ == protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			val = x != 0
		case num == 5 && typ == protowire.BytesType:
			raw, _ := protowire.ConsumeBytes(v)
			m := map[string]any{}
			err = decodeStruct(raw, m)
			val = m
		case num == 6 && typ == protowire.BytesType: // ListValue
			raw, _ := protowire.ConsumeBytes(v)
			list := []any{}
			err = fields(raw, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != 1 || typ != protowire.BytesType {
					return nil
				}
				x, err := decodeValue(v)
				list = append(list, x)
				return err
			})
			val = list
		}
		if err != nil {
			return nil, err
		}
	}
	return val, nil
}
