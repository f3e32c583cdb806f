package rls

import (
	"reflect"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
		{Code: CodeOverLimit, Limit: &Limit{Unit: 2}, UntilReset: -1},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: 10}, Remaining: 6, UntilReset: time.Minute},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: 1}, Remaining: 6, UntilReset: time.Minute},
	}
	b := AppendResponse([]byte("prefix"), CodeOverLimit, statuses, nil)
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
		{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: 2}},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: 2, UnitMultiplier: wrapperspb.UInt32(10)},
			LimitRemaining: 6, DurationUntilReset: durationpb.New(time.Minute)},
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 7, Unit: 2},
			LimitRemaining: 6, DurationUntilReset: durationpb.New(time.Minute)},
	}}
	if !proto.Equal(&got, want) {
		t.Errorf("got %v\nwant %v", &got, want)
	}
	// A body over 127 bytes has a length of two bytes.
	long := []Status{{Code: CodeOK, Limit: &Limit{Name: string(make([]byte, 200)), RequestsPerUnit: 1, Unit: 1}}}
	if err := proto.Unmarshal(AppendResponse(nil, CodeOK, long, nil), &got); err != nil || len(got.Statuses[0].CurrentLimit.Name) != 200 {
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
		{Status{Code: CodeOverLimit, Limit: &Limit{Unit: 3}, UntilReset: -1},
			[]*corev3.HeaderValue{header("RateLimit-Limit", "0"), header("RateLimit-Remaining", "0"), header("RateLimit-Reset", "3600")}},
	} {
		statuses := []Status{{Code: CodeOK}, tt.status}
		var got rlsv3.RateLimitResponse
		if err := proto.Unmarshal(AppendResponse(nil, tt.status.Code, statuses, &statuses[1]), &got); err != nil {
			t.Fatal(err)
		}
		want := &rlsv3.RateLimitResponse{ResponseHeadersToAdd: tt.want}
		if !proto.Equal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: got.ResponseHeadersToAdd}, want) || len(got.Statuses) != 2 {
			t.Errorf("%+v: got %v\nwant %v", tt.status, &got, want)
		}
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
