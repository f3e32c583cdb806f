package rls

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestDecodeJSONRequest(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		want       Request
	}{
		{"lowerCamel names, numbers in strings", `{"domain":"edge","hitsAddend":"2","descriptors":[
			{"entries":[{"key":"k","value":"v"},{"key":"path","value":"/x"}],"hitsAddend":"5","limit":{"requestsPerUnit":"7","unit":"HOUR","unitMultiplier":3}},
			{"entries":[{"key":"k"}],"isNegativeHits":false}]}`,
			Request{Domain: "edge", HitsAddend: 2, Descriptors: []Descriptor{
				{Entries: []Entry{{"k", "v"}, {"path", "/x"}}, HitsAddend: 5, HasHitsAddend: true,
					Override: &Override{RequestsPerUnit: 7, Unit: 3, UnitMultiplier: 3, HasUnitMultiplier: true}},
				{Entries: []Entry{{"k", ""}}}}}},
		{"proto names, a unit by number, null as the default", `{"domain":"edge","hits_addend":null,"descriptors":[
			{"entries":[{"key":"k","value":null}],"hits_addend":0,"limit":{"requests_per_unit":1e2,"unit":2}}]}`,
			Request{Domain: "edge", Descriptors: []Descriptor{
				{Entries: []Entry{{"k", ""}}, HasHitsAddend: true, Override: &Override{RequestsPerUnit: 100, Unit: 2}}}}},
		{"no descriptors", `{"domain":"edge"}`, Request{Domain: "edge", Descriptors: []Descriptor{}}},
	} {
		req := Request{Descriptors: []Descriptor{}}
		if err := DecodeJSONRequest([]byte(tt.body), &req); err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if !reflect.DeepEqual(req, tt.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.name, req, tt.want)
		}
	}
	for _, tt := range []struct{ body, err string }{
		{`{"domain":"edge"`, "body: not JSON"},
		{`[]`, "body: not a JSON object"},
		{`{"domain":3}`, "domain: want a string"},
		{`{"domian":"edge"}`, "domian: unknown field"},
		{`{"hitsAddend":-1}`, "hitsAddend: want an integer from 0 to 4294967295"},
		{`{"hitsAddend":1.5}`, "hitsAddend: want an integer"},
		{`{"hitsAddend":4294967296}`, "hitsAddend: want an integer"},
		{`{"descriptors":{}}`, "descriptors: want a list"},
		{`{"descriptors":[{"entries":[{"key":"k","val":"v"}]}]}`, "descriptors[0].entries[0].val: unknown field"},
		{`{"descriptors":[{},{"limit":{"unit":"FORTNIGHT"}}]}`, `descriptors[1].limit.unit: "FORTNIGHT" is not one of`},
		{`{"descriptors":[{"isNegativeHits":1}]}`, "descriptors[0].isNegativeHits: want true or false"},
		{`{"descriptors":[{"hitsAddend":"x"}]}`, "descriptors[0].hitsAddend: want an integer"},
	} {
		var req Request
		err := DecodeJSONRequest([]byte(tt.body), &req)
		if je, ok := err.(*JSONError); !ok || !strings.Contains(je.Error(), tt.err) {
			t.Errorf("%s: %v, want a *JSONError with %q", tt.body, err, tt.err)
		}
	}
}

// The JSON read as protobuf's JSON parser reads it is the message the
// binary form makes, whole.
func TestDecodeJSONRequest_SameAsProtobuf(t *testing.T) {
	msg := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "a", Value: "é\"\\"}, {Key: "b"}}, HitsAddend: wrapperspb.UInt64(1 << 40),
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_YEAR}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "c", Value: "d"}}, IsNegativeHits: true},
	}}
	for _, opts := range []protojson.MarshalOptions{{}, {UseProtoNames: true, UseEnumNumbers: true, EmitUnpopulated: true}} {
		js, err := opts.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		bin, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var fromJSON, fromBinary Request
		if err := DecodeJSONRequest(js, &fromJSON); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if err := DecodeRequest(bin, &fromBinary); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fromJSON, fromBinary) {
			t.Errorf("%s:\n got %+v\nwant %+v", js, fromJSON, fromBinary)
		}
	}
}

// The answer in JSON reads, with protobuf's JSON parser, as the message
// AppendResponse writes in binary, whole.
func TestAppendResponseJSON(t *testing.T) {
	req := &Request{Domain: "edge", HitsAddend: 2, Descriptors: []Descriptor{{Entries: []Entry{{"k", "v"}}}}}
	statuses := []Status{
		{Code: CodeOK},
		{Code: CodeOverLimit, Limit: &Limit{Name: "login", RequestsPerUnit: 2, Unit: 2}, UntilReset: 30*time.Second + 5*time.Millisecond},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 5, Unit: 7, UnitMultiplier: 10}, Remaining: 1, UntilReset: 2*time.Hour + 7},
		{Code: CodeOverLimit, Limit: &Limit{Unit: 3}, UntilReset: 1234 * time.Second},
		{Code: CodeOK, Remaining: 1<<32 - 1},
		{Code: CodeOK, Limit: &Limit{RequestsPerUnit: 1, Unit: 1}, UntilReset: 1500 * time.Microsecond},
	}
	for _, res := range []*Response{
		{Overall: CodeOverLimit, Statuses: statuses},
		{Overall: CodeOK, Statuses: statuses[:1]},
		{Overall: CodeOverLimit, Statuses: statuses, Headers: &statuses[2], HeaderNames: [3]string{"X-A", "X-B", "X-C"},
			Metadata: &Metadata{Request: req, Merged: map[string]any{"tier": "gold", "n": 2.5, "l": []any{true, "x"}}}},
		{Overall: CodeOK, Statuses: statuses[5:], Headers: &statuses[5]},
	} {
		jsonSameAsBinary(t, res)
	}
	// And as protobuf's JSON writer writes it, for the same message.
	msg := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
		{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			DurationUntilReset: durationpb.New(1500 * time.Microsecond)}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "RateLimit-Limit", Value: "1"}, {Key: "RateLimit-Remaining", Value: "0"}, {Key: "RateLimit-Reset", Value: "1"}}}
	want, err := protojson.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendResponseJSON(nil, &Response{Overall: CodeOK, Statuses: statuses[5:], Headers: &statuses[5]})
	// protobuf-go varies its spacing on purpose: compare without it.
	if strings.Join(strings.Fields(string(got)), "") != strings.Join(strings.Fields(string(want)), "") {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// FuzzDecodeJSONRequest_SameAsProtobuf: what protobuf's JSON parser reads
// (as envoyproxy/ratelimit's /json does), DecodeJSONRequest reads as the
// same message, whole; what it refuses, DecodeJSONRequest refuses. Text
// that is not JSON is refused, also where protobuf's parser is laxer (it
// reads 1e as a number).
func FuzzDecodeJSONRequest_SameAsProtobuf(f *testing.F) {
	for _, s := range []string{
		`{"domain":"edge","hitsAddend":"2","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"5","limit":{"requestsPerUnit":"7","unit":"HOUR","unitMultiplier":3}},{"entries":[{"key":"k"}],"isNegativeHits":false}]}`,
		`{"domain":"edge","hits_addend":null,"descriptors":[{"entries":[{"key":"k","value":null}],"hits_addend":0,"limit":{"requests_per_unit":1e2,"unit":2}}]}`,
		`{"domain":"e","descriptors":[{"entries":[]}],"descriptors":[]}`,
		`{"hitsAddend":1,"hits_addend":2}`,
		`{"hitsAddend":"1e1"}`, `{"hitsAddend":"+1"}`, `{"hitsAddend":" 1"}`, `{"hitsAddend":"0x10"}`, `{"hitsAddend":"01"}`,
		`{"hitsAddend":4294967295.0000001}`, `{"hitsAddend":-0}`, `{"hitsAddend":1.0}`, `{"hitsAddend":12e-1}`,
		`{"descriptors":[{"hitsAddend":18446744073709551615e0}]}`, `{"descriptors":[{"hitsAddend":9007199254740993}]}`,
		`{"descriptors":[{"hitsAddend":"9007199254740993e0"}]}`,
		`{"descriptors":[{"limit":{"unit":"2"}}]}`, `{"descriptors":[{"limit":{"unit":-1}}]}`, `{"descriptors":[{"limit":{"unit":2147483648}}]}`,
		`{"descriptors":[{"limit":{"unit":"second"}}]}`, `{"descriptors":[{"limit":{"unit":"WEEK"}}]}`, `{"descriptors":[{"limit":{"unit":7}}]}`,
		`{"domain":"\ud800"}`, "{\"domain\":\"\xff\"}", `{"dom\u0061in":"x"}`, `{"domain":"a"} `, `null`, `{}`, `{"descriptors":[null]}`,
		`{"descriptors":[{"entries":[null]}]}`, `{"descriptors":[{"entries":[{"key":"a","key":"b"}]}]}`,
		`{"descriptors":[{"isNegativeHits":true,"is_negative_hits":true}]}`, `{"descriptors":[{"limit":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var msg rlsv3.RateLimitRequest
		perr := protojson.Unmarshal(body, &msg)
		var got Request
		err := DecodeJSONRequest(body, &got)
		if perr != nil || !json.Valid(body) {
			if _, ok := err.(*JSONError); !ok {
				t.Fatalf("%q: %v; protobuf refuses it: %v", body, err, perr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v; protobuf reads it", body, err)
		}
		bin, err := proto.Marshal(&msg)
		if err != nil {
			t.Fatal(err)
		}
		var want Request
		if err := DecodeRequest(bin, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %+v\nwant %+v", body, got, want)
		}
	})
}

// jsonSameAsBinary fails t unless res in JSON reads, with protobuf's JSON
// parser, as res in binary, whole.
func jsonSameAsBinary(t *testing.T, res *Response) {
	t.Helper()
	js := AppendResponseJSON(nil, res)
	var fromJSON, fromBinary rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(js, &fromJSON); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	if err := proto.Unmarshal(AppendResponse(nil, res), &fromBinary); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&fromJSON, &fromBinary) {
		t.Fatalf("%s:\n got %v\nwant %v", js, &fromJSON, &fromBinary)
	}
}

// FuzzAppendResponseJSON: any answer in JSON reads, with protobuf's JSON
// parser, as the same answer in binary, whole.
func FuzzAppendResponseJSON(f *testing.F) {
	f.Add(uint8(2), int64(5), int32(7), "login", uint32(10), uint32(1), int64(7200e9+7), true, "X-A")
	f.Add(uint8(1), int64(1<<40), int32(99), "\x00é\"<>", uint32(1), uint32(1<<32-1), int64(1500e3), false, "")
	f.Fuzz(func(t *testing.T, code uint8, rpu int64, unit int32, name string, mult, remaining uint32, until int64, headers bool, header string) {
		if !utf8.ValidString(name) || !utf8.ValidString(header) || until < 0 {
			return // limit names come from YAML, header names from a flag; a wait is never negative
		}
		s := Status{Code: Code(code % 3), Remaining: remaining, UntilReset: time.Duration(until)}
		if rpu >= 0 {
			s.Limit = &Limit{Name: name, RequestsPerUnit: rpu, Unit: Unit(unit), UnitMultiplier: mult}
		}
		res := &Response{Overall: s.Code, Statuses: []Status{s, {Code: CodeOK}}}
		if headers && s.Limit != nil {
			res.Headers = &res.Statuses[0]
			res.HeaderNames = [3]string{header, "b", "c"}
		}
		jsonSameAsBinary(t, res)
	})
}
