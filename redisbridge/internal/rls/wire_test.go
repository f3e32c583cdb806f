package rls

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fromProto is what DecodeRequest must make of the generated type's value.
func fromProto(m *rlsv3.RateLimitRequest) Request {
	r := Request{Domain: m.GetDomain(), HitsAddend: m.GetHitsAddend()}
	for _, d := range m.GetDescriptors() {
		var out Descriptor
		for _, e := range d.GetEntries() {
			out.Entries = append(out.Entries, Entry{e.GetKey(), e.GetValue()})
		}
		if o := d.GetLimit(); o != nil {
			out.Override = &Override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: Unit(o.GetUnit())}
			if m := o.GetUnitMultiplier(); m != nil {
				out.Override.UnitMultiplier, out.Override.HasUnitMultiplier = m.GetValue(), true
			}
		}
		if h := d.GetHitsAddend(); h != nil {
			out.HitsAddend, out.HasHitsAddend = h.GetValue(), true
		}
		out.NegativeHits = d.GetIsNegativeHits()
		r.Descriptors = append(r.Descriptors, out)
	}
	return r
}

var requestSeeds = []*rlsv3.RateLimitRequest{
	{},
	{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/é"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k"}}, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 4},
			HitsAddend: wrapperspb.UInt64(0), IsNegativeHits: true},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k"}}, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 2,
			UnitMultiplier: wrapperspb.UInt32(10)}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k"}}, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{UnitMultiplier: wrapperspb.UInt32(0)}},
		{},
	}},
}

// FuzzDecodeRequest: whatever bytes come, DecodeRequest accepts what the
// generated type accepts and reads the same values from it.
func FuzzDecodeRequest(f *testing.F) {
	for _, m := range requestSeeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})       // domain not UTF-8
	f.Add([]byte{0x12, 0x05, 0x0a, 0x03, 0x0a}) // an entry cut short
	f.Add([]byte{0x1b, 0x08, 0x01, 0x1c})       // a group, skipped
	f.Fuzz(func(t *testing.T, b []byte) {
		var m rlsv3.RateLimitRequest
		want := proto.Unmarshal(b, &m)
		var got Request
		err := DecodeRequest(b, &got)
		if (err == nil) != (want == nil) {
			t.Fatalf("%x: DecodeRequest error %v, generated type's %v", b, err, want)
		}
		if err == nil && !reflect.DeepEqual(got, fromProto(&m)) {
			t.Fatalf("%x:\n got %+v\nwant %+v", b, got, fromProto(&m))
		}
	})
}

// AppendResponse writes what the generated type reads back whole.
func TestAppendResponse(t *testing.T) {
	statuses := []Status{
		{Code: CodeOK},
		{Code: CodeOverLimit, Limit: &Limit{Name: "edge.remote_address", RequestsPerUnit: 2, Unit: 2}, UntilReset: 30*time.Second + 5*time.Millisecond},
		{Code: CodeOK, Limit: &Limit{Name: "login", RequestsPerUnit: 1 << 40, Unit: 3}, Remaining: 300, UntilReset: 0},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 5, Unit: 7}, Remaining: 1, UntilReset: 2 * time.Hour},
		{Code: CodeOverLimit, Limit: &Limit{Unit: 2}, UntilReset: 10 * time.Second},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: 10}, Remaining: 6, UntilReset: time.Minute},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: 1}, Remaining: 6, UntilReset: time.Minute},
		{Code: CodeOK, Remaining: 1<<32 - 1}, // unlimited
	}
	b := AppendResponse([]byte("prefix"), &Response{Overall: CodeOverLimit, Statuses: statuses})
	if string(b[:6]) != "prefix" {
		t.Fatalf("the prefix was overwritten: %q", b[:6])
	}
	var got rlsv3.RateLimitResponse
	if err := proto.Unmarshal(b[6:], &got); err != nil {
		t.Fatal(err)
	}
	want := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OK},
		{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "edge.remote_address", RequestsPerUnit: 2, Unit: 2},
			DurationUntilReset: durationpb.New(30*time.Second + 5*time.Millisecond)},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "login", RequestsPerUnit: 1<<32 - 1, Unit: 3},
			LimitRemaining: 300, DurationUntilReset: &durationpb.Duration{}},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: 7},
			LimitRemaining: 1, DurationUntilReset: durationpb.New(2 * time.Hour)},
		{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: 2}, DurationUntilReset: durationpb.New(10 * time.Second)},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: wrapperspb.UInt32(10)},
			LimitRemaining: 6, DurationUntilReset: durationpb.New(time.Minute)},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: 2},
			LimitRemaining: 6, DurationUntilReset: durationpb.New(time.Minute)},
		{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 1<<32 - 1},
	}}
	if !proto.Equal(&got, want) {
		t.Errorf("got %v\nwant %v", &got, want)
	}
	// A body over 127 bytes has a length of two bytes.
	long := []Status{{Code: CodeOK, Limit: &Limit{Name: string(make([]byte, 200)), RequestsPerUnit: 1, Unit: 1}}}
	if err := proto.Unmarshal(AppendResponse(nil, &Response{Overall: CodeOK, Statuses: long}), &got); err != nil || len(got.Statuses[0].CurrentLimit.Name) != 200 {
		t.Errorf("a long status: %v", err)
	}
}

// AppendResponse's RateLimit headers: the status's limit, remaining, and
// reset in seconds rounded up (a limit of 0, which never resets: its
// window).
func TestAppendResponse_Headers(t *testing.T) {
	header := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }
	for _, tt := range []struct {
		status Status
		want   []*corev3.HeaderValue
	}{
		{Status{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 100, Unit: 2}, Remaining: 40, UntilReset: 29*time.Second + time.Millisecond},
			[]*corev3.HeaderValue{header("RateLimit-Limit", "100"), header("RateLimit-Remaining", "40"), header("RateLimit-Reset", "30")}},
		{Status{Code: CodeOverLimit, Limit: &Limit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: 10}, UntilReset: 90 * time.Second},
			[]*corev3.HeaderValue{header("RateLimit-Limit", "7"), header("RateLimit-Remaining", "0"), header("RateLimit-Reset", "90")}},
		{Status{Code: CodeOverLimit, Limit: &Limit{Unit: 3}, UntilReset: 1234 * time.Second},
			[]*corev3.HeaderValue{header("RateLimit-Limit", "0"), header("RateLimit-Remaining", "0"), header("RateLimit-Reset", "1234")}},
	} {
		statuses := []Status{{Code: CodeOK}, tt.status}
		var got rlsv3.RateLimitResponse
		if err := proto.Unmarshal(AppendResponse(nil, &Response{Overall: tt.status.Code, Statuses: statuses, Headers: &statuses[1]}), &got); err != nil {
			t.Fatal(err)
		}
		want := &rlsv3.RateLimitResponse{ResponseHeadersToAdd: tt.want}
		if !proto.Equal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: got.ResponseHeadersToAdd}, want) || len(got.Statuses) != 2 {
			t.Errorf("%+v: got %v\nwant %v", tt.status, &got, want)
		}
	}
}

// AppendResponse's dynamic metadata, read back whole by the generated
// type.
func TestAppendResponse_Metadata(t *testing.T) {
	req := &Request{Domain: "edge", HitsAddend: 3, Descriptors: []Descriptor{
		{Entries: []Entry{{"service", "service_1"}, {"path", "/a"}}},
		{Entries: []Entry{{"user", "u"}}, Override: &Override{RequestsPerUnit: 42, Unit: 3, UnitMultiplier: 2, HasUnitMultiplier: true},
			HitsAddend: 0, HasHitsAddend: true},
	}}
	merged := map[string]any{"n": json.Number("1.5"), "s": map[string]any{"t": true, "z": nil}, "l": []any{"x", json.Number("2")}}
	var got rlsv3.RateLimitResponse
	if err := proto.Unmarshal(AppendResponse(nil, &Response{Overall: CodeOK, Metadata: &Metadata{Request: req, Merged: merged}}), &got); err != nil {
		t.Fatal(err)
	}
	want, err := structpb.NewStruct(map[string]any{
		"domain":     "edge",
		"hitsAddend": 3,
		"descriptors": []any{
			map[string]any{"entries": []any{"service=service_1", "path=/a"}},
			map[string]any{"entries": []any{"user=u"}, "limit": "requests_per_unit:42 unit:HOUR unit_multiplier:{value:2}", "hitsAddend": 0},
		},
		"metadata": map[string]any{"n": 1.5, "s": map[string]any{"t": true, "z": nil}, "l": []any{"x", 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.DynamicMetadata, want) {
		t.Errorf("got %v\nwant %v", got.DynamicMetadata, want)
	}
	// Without hits_addend or metadata, neither field is there.
	got.Reset()
	if err := proto.Unmarshal(AppendResponse(nil, &Response{Overall: CodeOK, Metadata: &Metadata{Request: &Request{Domain: "d"}}}), &got); err != nil {
		t.Fatal(err)
	}
	if want, _ := structpb.NewStruct(map[string]any{"domain": "d", "descriptors": []any{}}); !proto.Equal(got.DynamicMetadata, want) {
		t.Errorf("got %v\nwant %v", got.DynamicMetadata, want)
	}
}

// FuzzAppendResponse_Metadata: the metadata of any JSON object, as a
// configuration holds it, reads back as the generated Struct of it, and
// the answer in JSON as the answer in binary.
func FuzzAppendResponse_Metadata(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"s":{"n":null,"b":false,"l":[1.5,"x",[],{}]}}`, `{"big":1e400,"neg":-0,"u":"\u00e9"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var merged map[string]any
		if dec.Decode(&merged) != nil || merged == nil || !finite(merged) {
			return
		}
		var got rlsv3.RateLimitResponse
		res := &Response{Overall: CodeOK, Metadata: &Metadata{Request: &Request{Domain: "d"}, Merged: merged}}
		b := AppendResponse(nil, res)
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		fields := map[string]any{"domain": "d", "descriptors": []any{}}
		if len(merged) > 0 {
			fields["metadata"] = floats(merged)
		}
		want, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if !proto.Equal(got.DynamicMetadata, want) {
			t.Fatalf("%s:\n got %v\nwant %v", doc, got.DynamicMetadata, want)
		}
		jsonSameAsBinary(t, res) // and the same in JSON, as /json answers
	})
}

// finite reports whether every number in v is within a double's range,
// as in every configuration: YAML reads 1e400 as a string.
func finite(v any) bool {
	switch v := v.(type) {
	case json.Number:
		_, err := strconv.ParseFloat(string(v), 64)
		return err == nil
	case map[string]any:
		for _, x := range v {
			if !finite(x) {
				return false
			}
		}
	case []any:
		for _, x := range v {
			if !finite(x) {
				return false
			}
		}
	}
	return true
}

// floats is v with its json.Numbers as float64, as structpb takes them.
func floats(v any) any {
	switch v := v.(type) {
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = floats(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = floats(x)
		}
		return out
	}
	return v
}

func TestMergeMetadata(t *testing.T) {
	shared := map[string]any{"x": "from b"}
	for _, tt := range []struct {
		name          string
		dst, src, out map[string]any
	}{
		{"into nothing", nil, map[string]any{"a": "1"}, map[string]any{"a": "1"}},
		{"a field added", map[string]any{"a": "1"}, map[string]any{"b": "2"}, map[string]any{"a": "1", "b": "2"}},
		{"the first value stays", map[string]any{"a": "1"}, map[string]any{"a": "2"}, map[string]any{"a": "1"}},
		{"mappings merged", map[string]any{"m": shared}, map[string]any{"m": map[string]any{"x": "other", "y": "2"}},
			map[string]any{"m": map[string]any{"x": "from b", "y": "2"}}},
		{"a mapping and a value: the first stays", map[string]any{"m": "1"}, map[string]any{"m": map[string]any{"y": "2"}}, map[string]any{"m": "1"}},
	} {
		if got := MergeMetadata(tt.dst, tt.src); !reflect.DeepEqual(got, tt.out) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.out)
		}
	}
	if len(shared) != 1 {
		t.Errorf("a merge changed a mapping it was given: %v", shared)
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	msg, _ := proto.Marshal(requestSeeds[1])
	var r Request
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeRequest(msg, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodeHealthRequest: DecodeHealthRequest accepts what the generated
// type accepts and reads the same service from it.
func FuzzDecodeHealthRequest(f *testing.F) {
	for _, m := range []*healthpb.HealthCheckRequest{{}, {Service: "envoy.service.ratelimit.v3.RateLimitService"}} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m healthpb.HealthCheckRequest
		want := proto.Unmarshal(b, &m)
		got, err := DecodeHealthRequest(b)
		if (err == nil) != (want == nil) || err == nil && got != m.GetService() {
			t.Fatalf("%x: %q %v, generated type's %q %v", b, got, err, m.GetService(), want)
		}
	})
}
