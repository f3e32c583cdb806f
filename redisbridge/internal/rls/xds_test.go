package rls

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// marshal is the protobuf of each resource, as a server sends it.
func marshal(t *testing.T, resources ...*rlsconf.RateLimitConfig) [][]byte {
	t.Helper()
	var out [][]byte
	for _, r := range resources {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// A resource is read as the file with its fields: the configuration of
// RateLimitConfig resources equals, whole, that of the YAML files that
// say the same (the generated types write the resources).
func TestParseXDS(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"team": "a", "weight": 1.5, "tags": []any{"x", true, nil}, "nested": map[string]any{"count": 2}})
	if err != nil {
		t.Fatal(err)
	}
	edge := &rlsconf.RateLimitConfig{Name: "edge-config", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 10}},
		{Key: "path", Value: "/login", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 5, Name: "login"},
			ShadowMode: true, Metadata: meta},
		{Key: "path", Value: "/free", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
		{Key: "blocked", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR}}, // 0: every call refused
		{Key: "user", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "path", Value: "/login", QuotaMode: true,
				RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_WEEK, RequestsPerUnit: 2, Replaces: []*rlsconf.RateLimitReplace{{Name: "login"}}}},
			{Key: "path", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_YEAR, RequestsPerUnit: 4_000_000_000}},
		}},
		{Key: "file", Value: "a/*", DetailedMetric: true, RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MONTH, RequestsPerUnit: 3}},
	}}
	other := &rlsconf.RateLimitConfig{Name: "other", Domain: "internal", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 1}}}}
	const yaml = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    shadow_mode: true
    metadata: {team: a, weight: 1.5, tags: [x, true, null], nested: {count: 2}}
    rate_limit: {unit: minute, requests_per_unit: 5, name: login}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: user
    descriptors:
      - key: path
        value: /login
        quota_mode: true
        rate_limit: {unit: week, requests_per_unit: 2, replaces: [{name: login}]}
      - key: path
        rate_limit: {unit: year, requests_per_unit: 4000000000}
  - key: file
    value: a/*
    detailed_metric: true
    rate_limit: {unit: month, requests_per_unit: 3}
`
	got, err := ParseXDS(marshal(t, edge, other), false)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse(map[string][]byte{"a.yaml": []byte(yaml), "b.yaml": []byte("domain: internal\ndescriptors: [{key: k, rate_limit: {unit: day, requests_per_unit: 1}}]")}, false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("from xDS:\n%s\nfrom YAML:\n%s", limitsOf(got), limitsOf(want))
	}

	// A message field given twice is merged, as protobuf merges it: the
	// rate limit's name from the first, its unit and number from the
	// second.
	first, _ := proto.Marshal(&rlsconf.RateLimitDescriptor{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Name: "n", RequestsPerUnit: 9}})
	second, _ := proto.Marshal(&rlsconf.RateLimitDescriptor{RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 4}})
	head, _ := proto.Marshal(&rlsconf.RateLimitConfig{Domain: "m"})
	var twice rlsconf.RateLimitConfig
	if err := proto.Unmarshal(append(append([]byte(nil), head...), descriptorField(append(first, second...))...), &twice); err != nil {
		t.Fatal(err)
	}
	merged, err := ParseXDS(marshal(t, &twice), false)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ParseXDS([][]byte{append(append([]byte(nil), head...), descriptorField(append(first, second...))...)}, false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(raw, merged) || !strings.Contains(raw.Dump(), "m.k: unit=SECOND requests_per_unit=4") {
		t.Errorf("merged fields:\n%s\nwant as protobuf merges them:\n%s", raw.Dump(), merged.Dump())
	}
}

// descriptorField is field 3 of a RateLimitConfig (a descriptor) holding b.
func descriptorField(b []byte) []byte {
	out := []byte{3<<3 | 2}
	n := len(b)
	for n >= 0x80 {
		out = append(out, byte(n)|0x80)
		n >>= 7
	}
	return append(append(out, byte(n)), b...)
}

// A resource refused is named, with the field at fault, as a file is.
func TestParseXDS_Refused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources []*rlsconf.RateLimitConfig
		err       string
	}{
		{"no domain", []*rlsconf.RateLimitConfig{{Name: "a"}}, "xds:a: domain: required"},
		{"unknown unit", []*rlsconf.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{RequestsPerUnit: 1}}}}}, `xds:a: descriptors[0].rate_limit.unit: "" is not second`},
		{"unit with unlimited", []*rlsconf.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND}}}}}, "xds:a: descriptors[0].rate_limit.unit: must not be given with unlimited"},
		{"one domain twice", []*rlsconf.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}}, `xds:b: domain "d" is configured in xds:a too`},
		{"one name twice", []*rlsconf.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "a", Domain: "e"}}, "xds:a: two resources of that name"},
		{"NaN in metadata", []*rlsconf.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"x": structpb.NewNumberValue(nan())}}}}}}, "xds:a: metadata: NaN is not a number"},
	} {
		_, err := ParseXDS(marshal(t, tc.resources...), false)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	// Merged, two resources configure one domain.
	if _, err := ParseXDS(marshal(t, &rlsconf.RateLimitConfig{Name: "a", Domain: "d"}, &rlsconf.RateLimitConfig{Name: "b", Domain: "d"}), true); err != nil {
		t.Errorf("merged: %v", err)
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

// limitsOf lists c's limits whole, metadata included, a line each;
// "<none>" for no configuration.
func limitsOf(c *Config) string {
	if c == nil {
		return "<none>"
	}
	var lines []string
	var walk func(at string, n *node)
	walk = func(at string, n *node) {
		if n.limit != nil {
			lines = append(lines, fmt.Sprintf("%s %+v", at, *n.limit))
		}
		for k, child := range n.children {
			walk(at+"."+k, child)
		}
		for _, w := range n.wildcards {
			walk(at+"."+strings.Join(w.parts, "*"), w.child)
		}
	}
	for d, n := range c.domains {
		walk(d, n)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// FuzzParseXDS holds the resource reader to the generated type: bytes it
// reads are bytes protobuf reads, and they make the configuration that the
// generated type's own encoding of what it read makes (or the same error),
// whole; bytes protobuf refuses, it refuses.
func FuzzParseXDS(f *testing.F) {
	meta, _ := structpb.NewStruct(map[string]any{"a": 1.5, "l": []any{"x", nil, map[string]any{"b": true}}})
	for _, c := range []*rlsconf.RateLimitConfig{
		{Name: "n", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Value: "v",
			RateLimit:   &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 3, Name: "x", Replaces: []*rlsconf.RateLimitReplace{{Name: "y"}}},
			Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "c", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}}}, ShadowMode: true, QuotaMode: true, Metadata: meta}}},
		{Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: 99}}}},
	} {
		b, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x02, 0xff, 0xfe}) // domain not UTF-8
	f.Fuzz(func(t *testing.T, b []byte) {
		var m rlsconf.RateLimitConfig
		perr := proto.Unmarshal(b, &m)
		got, err := ParseXDS([][]byte{b}, false)
		if perr != nil {
			if err == nil {
				t.Fatalf("%x: read, where protobuf refuses it: %v", b, perr)
			}
			return
		}
		canon, err2 := proto.Marshal(&m)
		if err2 != nil {
			t.Fatal(err2)
		}
		want, werr := ParseXDS([][]byte{canon}, false)
		if fmt.Sprint(err) != fmt.Sprint(werr) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%x:\n got %v %v\nwant %v %v (its encoding by the generated type)", b, limitsOf(got), err, limitsOf(want), werr)
		}
	})
}
