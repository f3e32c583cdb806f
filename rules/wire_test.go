package rules

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckRequest_RoundTrip(t *testing.T) {
	pen := &Penalty{Enabled: true, DetectionWindowMS: 3600_000, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4}}
	specs := []LimitSpec{
		{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 20, Cost: 2, Penalty: pen},
		{Algorithm: SlidingLog, Limit: 5, WindowMS: 60_000, Burst: 5, Cost: 1},
	}
	limits := []PlannedLimit{
		{Key: []byte(`rl:{u:"al\ice"}:r`), Name: "r", Spec: &specs[0], Action: Reject, PerUser: true},
		{Key: []byte("rl:{g}:s"), Name: "s", Spec: &specs[1], Action: LogOnly},
	}
	body := AppendCheckRequest(nil, "req-1", "alice", "/v1/x", limits)
	req, err := DecodeCheckRequest(body)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	if req.RequestID != "req-1" || req.User != "alice" || req.Endpoint != "/v1/x" || len(req.Limits) != 2 {
		t.Fatalf("decoded %+v", req)
	}
	a, b := req.Limits[0], req.Limits[1]
	if a.Key != `rl:{u:"al\ice"}:r` || a.Rule != "r" || a.Shadow || !a.PerUser || a.Spec.Algorithm != TokenBucket ||
		a.Spec.Limit != 10 || a.Spec.WindowMS != 1000 || a.Spec.Burst != 20 || a.Spec.Cost != 2 {
		t.Errorf("limit 0: %+v", a)
	}
	if a.Spec.Penalty == nil || a.Spec.Penalty.ViolationThreshold != 3 || len(a.Spec.Penalty.Multipliers) != 3 {
		t.Errorf("penalty: %+v", a.Spec.Penalty)
	}
	if !b.Shadow || b.PerUser || b.Spec.Penalty != nil || b.Spec.Algorithm != SlidingLog {
		t.Errorf("limit 1: %+v", b)
	}
	again := AppendCheckRequestFrom(nil, &req)
	if string(again) != string(body) {
		t.Errorf("re-encoding differs:\n%s\n%s", body, again)
	}
}

func TestDecodeCheckRequest_Errors(t *testing.T) {
	lim := func(extra string) string {
		return `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":1000` + extra + `}]}`
	}
	tests := []struct{ name, body, msg string }{
		{"not json", `{`, "not valid JSON"},
		{"array", `[]`, "must be a JSON object"},
		{"no limits", `{}`, "limits: must be an array"},
		{"empty limits", `{"limits":[]}`, "1 to 64"},
		{"too many", `{"limits":[` + strings.Repeat(`{},`, 64) + `{}]}`, "1 to 64"},
		{"limit not object", `{"limits":[1]}`, "limits[0].(limit)"},
		{"key missing", `{"limits":[{"algorithm":"fixed_window","limit":1,"window_ms":1}]}`, "limits[0].key"},
		{"key huge", `{"limits":[{"key":"` + strings.Repeat("k", 600) + `"}]}`, "limits[0].key"},
		{"algorithm", `{"limits":[{"key":"k","algorithm":"leaky","limit":1,"window_ms":1}]}`, "limits[0].algorithm"},
		{"negative limit", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":-1,"window_ms":1}]}`, "limits[0].limit"},
		{"overflow limit", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":99999999999999999999,"window_ms":1}]}`, "limits[0].limit"},
		{"float window", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":1.5}]}`, "limits[0].window_ms"},
		{"zero cost", lim(`,"cost":0`), "limits[0].cost"},
		{"shadow string", lim(`,"shadow":"yes"`), "limits[0].shadow"},
		{"penalty multipliers", lim(`,"penalty":{"window_ms":1000,"threshold":1,"multipliers":[0]}`), "penalty.multipliers[0]"},
		{"penalty no multipliers", lim(`,"penalty":{"window_ms":1000,"threshold":1}`), "penalty.multipliers"},
		{"user not string", `{"user":5,"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":1}]}`, "user"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeCheckRequest([]byte(tc.body))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalidCheck) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q: want ErrInvalidCheck mentioning %q", err, tc.msg)
			}
		})
	}
}

func TestCheckResponse_RoundTrip(t *testing.T) {
	in := CheckResponse{Allowed: false, NowMS: 1700000000123, Decisions: []Decision{
		{Allowed: true, Limit: 10, Remaining: 9, ResetMS: 1700000001000},
		{Allowed: false, Limit: 5, Remaining: 0, ResetMS: 1700000060000, RetryAfterMS: 59877},
	}}
	body := AppendCheckResponse(nil, &in)
	var out CheckResponse
	if err := DecodeCheckResponse(body, 2, &out); err != nil {
		t.Fatal(err)
	}
	if out.Allowed != in.Allowed || out.NowMS != in.NowMS || len(out.Decisions) != 2 || out.Decisions[1] != in.Decisions[1] || out.Decisions[0] != in.Decisions[0] {
		t.Errorf("got %+v", out)
	}
	for _, bad := range []string{`{`, `{"decisions":[]}`, `{"allowed":true,"decisions":[{}]}`, `{"allowed":true,"decisions":[{},{},{}]}`} {
		if err := DecodeCheckResponse([]byte(bad), 2, &out); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func FuzzDecodeCheckRequest(f *testing.F) {
	f.Add([]byte(`{"request_id":"r","user":"u","endpoint":"/e","limits":[{"key":"rl:{u:a}:r","rule":"r","algorithm":"token_bucket","limit":10,"window_ms":1000,"burst":20,"cost":1,"per_user":true,"penalty":{"window_ms":3600000,"threshold":3,"multipliers":[1,2]}}]}`))
	f.Add([]byte(`{"limits":[{"key":"k","algorithm":"sliding_log","limit":1e3,"window_ms":-1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeCheckRequest(body)
		if err != nil {
			if !errors.Is(err, ErrInvalidCheck) {
				t.Fatalf("error does not wrap ErrInvalidCheck: %v", err)
			}
			return
		}
		for _, l := range req.Limits {
			s := l.Spec
			if s.Limit < 1 || s.Limit > MaxLimitValue || s.WindowMS < 1 || s.WindowMS > MaxWindowMS || s.Cost < 1 || s.Burst < 1 || len(l.Key) == 0 || len(l.Key) > MaxKeyLen {
				t.Fatalf("accepted out-of-range limit %+v", l)
			}
		}
		// What decodes re-encodes to something that decodes the same.
		again, err := DecodeCheckRequest(AppendCheckRequestFrom(nil, &req))
		if err != nil || len(again.Limits) != len(req.Limits) {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
	})
}

// The plugin parses whatever its call-out returns: never panic, and never
// report more or fewer decisions than were asked for.
func FuzzDecodeCheckResponse(f *testing.F) {
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0}]}`), 1)
	f.Add([]byte(`{"allowed":false,"decisions":[{},{}]}`), 2)
	f.Add([]byte(`{"allowed":true,"decisions":{"a":1}}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, want int) {
		if want < 0 || want > MaxLimitsPerCheck {
			return
		}
		var resp CheckResponse
		if err := DecodeCheckResponse(body, want, &resp); err == nil && len(resp.Decisions) != want {
			t.Fatalf("accepted %d decisions, want %d", len(resp.Decisions), want)
		}
	})
}

// A check for a long or non-ASCII path still decodes: the override fields
// are left out rather than exceed what the bridge accepts.
func TestAppendCheckRequest_LongOverrideFields(t *testing.T) {
	spec := &LimitSpec{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000, Burst: 3, Cost: 1}
	limits := []PlannedLimit{{Key: []byte("rl:{a:1.2.3.4}:r"), Name: "r", Spec: spec, Action: Reject}}
	for _, endpoint := range []string{"/" + strings.Repeat("a", 600), "/" + strings.Repeat("\xff", 300), "/short"} {
		req, err := DecodeCheckRequest(AppendCheckRequest(nil, "id", strings.Repeat("u", 300), endpoint, limits))
		if err != nil {
			t.Fatalf("endpoint of %d bytes: %v", len(endpoint), err)
		}
		if want := endpoint == "/short"; (req.Endpoint != "") != want || req.User != "" {
			t.Errorf("endpoint of %d bytes: endpoint %q user %q", len(endpoint), req.Endpoint, req.User)
		}
	}
}
