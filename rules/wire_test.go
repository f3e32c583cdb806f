package rules

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCheckRequest_RoundTrip(t *testing.T) {
	pen := &Penalty{Enabled: true, DetectionWindowMS: 3600_000, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4}}
	specs := []LimitSpec{
		{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 20, Cost: 2, Penalty: pen},
		{Algorithm: SlidingLog, Limit: 5, WindowMS: 60_000, Burst: 5, Cost: 1},
		{Algorithm: FixedWindow, Limit: 50, WindowMS: 1000, Burst: 50, Cost: 1},
	}
	limits := []PlannedLimit{
		{Key: []byte(`rl:{u:"al\ice"}:r`), Rule: "r", Spec: &specs[0], Action: Reject, PerUser: true},
		{Key: []byte("rl:{g}:s"), Rule: "s", Spec: &specs[1], Action: LogOnly},
		{Key: []byte("rl:{g}:t"), Rule: "t", Spec: &specs[2], Action: Throttle, MaxDelayMS: 5000},
		{Key: []byte("rl:{g}:u"), Rule: "u", Spec: &specs[2], Action: Throttle}, // may not wait
	}
	body := AppendCheckRequest(nil, "req-1", "alice", "/v1/x", limits)
	req, err := DecodeCheckRequest(body)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	if req.RequestID != "req-1" || req.User != "alice" || req.Endpoint != "/v1/x" || len(req.Limits) != 4 {
		t.Fatalf("decoded %+v", req)
	}
	a, b := req.Limits[0], req.Limits[1]
	for i, w := range []struct {
		throttle bool
		maxDelay int64
	}{{false, 0}, {false, 0}, {true, 5000}, {true, 0}} {
		if l := req.Limits[i]; l.Throttle != w.throttle || l.MaxDelayMS != w.maxDelay {
			t.Errorf("limit %d: throttle %v max delay %d, want %+v", i, l.Throttle, l.MaxDelayMS, w)
		}
	}
	if a.Key != `rl:{u:"al\ice"}:r` || a.Rule != "r" || a.LogOnly || !a.PerUser || a.Spec.Algorithm != TokenBucket ||
		a.Spec.Limit != 10 || a.Spec.WindowMS != 1000 || a.Spec.Burst != 20 || a.Spec.Cost != 2 {
		t.Errorf("limit 0: %+v", a)
	}
	if a.Spec.Penalty == nil || a.Spec.Penalty.ViolationThreshold != 3 || len(a.Spec.Penalty.Multipliers) != 3 {
		t.Errorf("penalty: %+v", a.Spec.Penalty)
	}
	if !b.LogOnly || b.PerUser || b.Spec.Penalty != nil || b.Spec.Algorithm != SlidingLog {
		t.Errorf("limit 1: %+v", b)
	}
	again := AppendCheckRequestFrom(nil, &req)
	if string(again) != string(body) {
		t.Errorf("re-encoding differs:\n%s\n%s", body, again)
	}
}

// A lease asked for, a lease handed back and the operations that renew
// and return leases travel and decode as sent.
func TestCheckRequest_LeaseRoundTrip(t *testing.T) {
	spec := &LimitSpec{Algorithm: TokenBucket, Limit: 100, WindowMS: 1000, Burst: 100, Cost: 2, Lease: Lease{Size: 50, TTLMS: 200}}
	l := PlannedLimit{Key: []byte("rl:{g}:hot"), Rule: "hot", Spec: spec, Action: Reject,
		AskLease: true, Return: LeaseReturn{Tag: -7, Granted: 50, Units: 12}}
	for _, tc := range []struct {
		op   Op
		body []byte
	}{
		{OpDecide, AppendCheckRequest(nil, "r", "", "", []PlannedLimit{l})},
		{OpRenew, AppendLeaseCall(nil, OpRenew, "r", &l)},
		{OpReturn, AppendLeaseCall(nil, OpReturn, "r", &l)},
	} {
		req, err := DecodeCheckRequest(tc.body)
		if err != nil {
			t.Fatalf("%v\n%s", err, tc.body)
		}
		got := req.Limits[0]
		if req.Op != tc.op || got.Spec.Lease != spec.Lease || got.Return != l.Return {
			t.Errorf("%s: decoded op %v lease %+v return %+v", tc.body, req.Op, got.Spec.Lease, got.Return)
		}
		if again := AppendCheckRequestFrom(nil, &req); string(again) != string(tc.body) {
			t.Errorf("re-encoding differs:\n%s\n%s", tc.body, again)
		}
	}
	// Not asked for, nothing is sent: a limit's lease is a request of the caller.
	l.AskLease, l.Return = false, LeaseReturn{}
	if body := AppendCheckRequest(nil, "r", "", "", []PlannedLimit{l}); strings.Contains(string(body), "lease") {
		t.Errorf("lease sent unasked: %s", body)
	}
}

// A fill limit (charged after the response: peeked at cost 0 before its
// request, charged what it cost after) travels and decodes as sent; only
// a fill limit may cost 0.
func TestCheckRequest_FillRoundTrip(t *testing.T) {
	for _, cost := range []int64{0, 1, 12_345, MaxLimitValue} {
		in := CheckRequest{RequestID: "r", User: "alice", Endpoint: "/v1/chat", Limits: []LimitRequest{
			{Key: "rl:{u:alice}:tokens", Rule: "tokens", PerUser: true, Fill: true,
				Spec: LimitSpec{Algorithm: FixedWindow, Limit: 1000, WindowMS: 3600_000, Burst: 1000, Cost: cost}},
			{Key: "rl:{g}:all", Rule: "all", Spec: LimitSpec{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 10, Cost: 1}},
		}}
		roundTrip(t, &in)
	}
}

// roundTrip encodes in, requires it to decode to in, and returns the
// encoding.
func roundTrip(t *testing.T, in *CheckRequest) []byte {
	t.Helper()
	body := AppendCheckRequestFrom(nil, in)
	got, err := DecodeCheckRequest(body)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	if !reflect.DeepEqual(got, *in) {
		t.Errorf("round trip:\n got %+v\nwant %+v\n%s", got, *in, body)
	}
	return body
}

// A limit of calendar months goes as window_months, never window_ms, so
// that a bridge that does not know them refuses it.
func TestCheckRequest_MonthsRoundTrip(t *testing.T) {
	in := CheckRequest{RequestID: "r", User: "alice", Limits: []LimitRequest{
		{Key: "rl:{u:alice}:monthly", Rule: "monthly", PerUser: true,
			Spec: LimitSpec{Algorithm: FixedWindow, Limit: 100_000, WindowMS: 3 * MonthMS, Months: 3, Burst: 100_000, Cost: 1}},
		{Key: "rl:{g}:all", Rule: "all", Spec: LimitSpec{Algorithm: FixedWindow, Limit: 10, WindowMS: 1000, Burst: 10, Cost: 1}},
	}}
	body := roundTrip(t, &in)
	if !strings.Contains(string(body), `"limit":100000,"window_months":3,"burst"`) || strings.Count(string(body), `"window_ms"`) != 1 {
		t.Errorf("months not sent as window_months alone:\n%s", body)
	}
}

// A limit charged after the response is asked at cost 0, as a fill limit,
// before its request, from the head its rule rendered; the charge after
// the response carries what the response cost, log_only and without its
// penalty, and leaves out what costs nothing.
func TestAppendChargeRequest(t *testing.T) {
	c, err := ParseConfig([]byte(`{"penalty": {},
  "tiers": {"list": [{"name": "free", "limit": 5000, "window": "1d", "on_response": {"cost_header": "x-tokens"},
                      "endpoints": {"/v1/chat": 2000}}]},
  "rules": [{"name": "tokens", "limit": 1000, "window": "1h", "algorithm": "fixed_window", "on_response": {"cost_header": "x-tokens"}},
            {"name": "logins", "scope": "ip", "limit": 5, "window": "15m", "on_response": {"statuses": [401]}},
            {"name": "plain", "scope": "global", "limit": 10, "window": "1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var plan Plan
	c.Evaluate(&Request{Method: "GET", Path: "/v1/chat", Headers: mapHeaders{"x-user-id": "alice"}, Source: "192.0.2.1:1"}, &plan)
	if len(plan.Limits) != 4 || plan.Limits[3].Rule != "tier.free.0" || plan.Limits[3].OnResponse == nil {
		t.Fatalf("limits: %+v", plan.Limits)
	}
	check, err := DecodeCheckRequest(AppendCheckRequest(nil, "r", "", "", plan.Limits))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range check.Limits {
		onResponse := plan.Limits[i].OnResponse != nil
		if l.Fill != onResponse || onResponse != (l.Spec.Cost == 0) || l.Spec.Penalty == nil || l.LogOnly {
			t.Errorf("check's limit %d (%s): fill %v cost %d penalty %v log_only %v", i, l.Rule, l.Fill, l.Spec.Cost, l.Spec.Penalty, l.LogOnly)
		}
	}
	// Rendered anew, without the rule's head: the same text.
	heads := slices.Clone(plan.Limits)
	for i := range heads {
		heads[i].head = nil
	}
	if a, b := AppendCheckRequest(nil, "r", "", "", plan.Limits), AppendCheckRequest(nil, "r", "", "", heads); string(a) != string(b) {
		t.Errorf("with heads:\n%s\nwithout:\n%s", a, b)
	}

	plan.Limits[0].Charge, plan.Limits[1].Charge, plan.Limits[2].Charge, plan.Limits[3].Charge = 1234, 0, 9, 0
	body := AppendChargeRequest(nil, "r", "alice", "/v1/chat", plan.Limits)
	charge, err := DecodeCheckRequest(body)
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	want := CheckRequest{RequestID: "r", User: "alice", Endpoint: "/v1/chat", Limits: []LimitRequest{{
		Key: string(plan.Limits[0].Key), Rule: "tokens", Fill: true, LogOnly: true, PerUser: true,
		Spec: LimitSpec{Algorithm: FixedWindow, Limit: 1000, WindowMS: 3600_000, Burst: 1000, Cost: 1234},
	}}}
	if !reflect.DeepEqual(charge, want) {
		t.Errorf("charge:\n got %+v\nwant %+v\n%s", charge, want, body)
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
		{"log_only string", lim(`,"log_only":"yes"`), "limits[0].log_only"},
		{"penalty multipliers", lim(`,"penalty":{"detection_window_ms":1000,"violation_threshold":1,"multipliers":[0]}`), "penalty.multipliers[0]"},
		{"penalty no multipliers", lim(`,"penalty":{"detection_window_ms":1000,"violation_threshold":1}`), "penalty.multipliers"},
		{"not UTF-8", "{\"limits\":[{\"key\":\"k\",\"rule\":\"\x8e\",\"algorithm\":\"fixed_window\",\"limit\":1,\"window_ms\":1}]}", "not UTF-8"},
		{"user not string", `{"user":5,"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":1}]}`, "user"},
		{"op", `{"op":"lease","limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":1}]}`, "op: must be"},
		{"lease size", lim(`,"lease":{"size":0,"ttl_ms":100}`), "limits[0].lease.size"},
		{"lease ttl", lim(`,"lease":{"size":1,"ttl_ms":60001}`), "limits[0].lease.ttl_ms"},
		{"lease not object", lim(`,"lease":5`), "limits[0].lease: must be an object"},
		{"return units", lim(`,"lease_return":{"tag":1,"granted":5,"units":6}`), "limits[0].lease_return.units"},
		{"return granted", lim(`,"lease_return":{"tag":1,"units":1}`), "limits[0].lease_return.granted"},
		{"max delay", lim(`,"max_delay_ms":30001`), "limits[0].max_delay_ms: must be an integer from 0 to 30000"},
		{"max delay negative", lim(`,"max_delay_ms":-1`), "limits[0].max_delay_ms"},
		{"max delay log_only", lim(`,"log_only":true,"max_delay_ms":5`), "limits[0].max_delay_ms: a log_only limit"},
		{"max delay sliding window", `{"limits":[{"key":"k","algorithm":"sliding_window","limit":1,"window_ms":1000,"max_delay_ms":5}]}`, "limits[0].max_delay_ms: a sliding_window limit"},
		{"max delay lease", lim(`,"max_delay_ms":5,"lease":{"size":1,"ttl_ms":100}`), "limits[0].lease: a throttle limit is not leased"},
		{"fill string", lim(`,"fill":1`), "limits[0].fill: must be a boolean"},
		{"months and window", lim(`,"window_months":1`), "limits[0].window_months: a limit has window_ms or window_months, not both"},
		{"months of a token bucket", `{"limits":[{"key":"k","algorithm":"token_bucket","limit":1,"window_months":1}]}`, "limits[0].window_months: only a fixed_window"},
		{"five months", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_months":5}]}`, "limits[0].window_months: must be 1, 2, 3, 4, 6 or 12"},
		{"months zero", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_months":0}]}`, "limits[0].window_months: must be an integer from 1 to 12"},
		{"months throttled", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_months":1,"max_delay_ms":5}]}`, "limits[0].max_delay_ms: a limit of calendar months"},
		{"months lease return", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_months":1,"lease_return":{"tag":1,"granted":5,"units":1}}]}`, "limits[0].lease_return: a limit of calendar months"},
		{"months leased", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_months":1,"lease":{"size":1,"ttl_ms":100}}]}`, "limits[0].lease: a limit of calendar months"},
		{"fill negative cost", lim(`,"fill":true,"cost":-1`), "limits[0].cost: must be an integer from 0 to"},
		{"zero cost, fill false", lim(`,"fill":false,"cost":0`), "limits[0].cost: must be an integer from 1 to"},
		{"fill max delay", lim(`,"fill":true,"max_delay_ms":5`), "limits[0].max_delay_ms: a fill limit is not throttled"},
		{"fill lease", lim(`,"fill":true,"lease":{"size":1,"ttl_ms":100}`), "limits[0].lease: a fill limit is not leased"},
		{"fill lease return", lim(`,"fill":true,"lease_return":{"tag":1,"granted":5,"units":1}`), "limits[0].lease_return: a fill limit holds no lease"},
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
	lease := in
	lease.Decisions = []Decision{in.Decisions[0], {Allowed: true, Limit: 9, Remaining: 3, Lease: LeaseGrant{Units: 5, TTLMS: 200, Tag: 1700000000323}}}
	var got CheckResponse
	if err := DecodeCheckResponse(AppendCheckResponse(nil, &lease), 2, &got); err != nil || !reflect.DeepEqual(got, lease) {
		t.Errorf("lease: got %+v (%v), want %+v", got, err, lease)
	}
	delayed := CheckResponse{Allowed: true, NowMS: 1700000000123, DelayMS: 740, Decisions: []Decision{{Allowed: true, Limit: 50, ResetMS: 1700000002000}}}
	body := AppendCheckResponse(nil, &delayed)
	if !strings.Contains(string(body), `"now_ms":1700000000123,"delay_ms":740,`) {
		t.Errorf("delayed answer: %s", body)
	}
	if err := DecodeCheckResponse(body, 1, &got); err != nil || !reflect.DeepEqual(got, delayed) {
		t.Errorf("delay: got %+v (%v), want %+v", got, err, delayed)
	}
	body = AppendCheckResponse(nil, &in)
	if strings.Contains(string(body), "delay_ms") {
		t.Errorf("an answer without a delay says one: %s", body)
	}
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

// Whatever decodes is in range, and re-encodes to a body that decodes to
// the same request.
func FuzzDecodeCheckRequest(f *testing.F) {
	f.Add([]byte(`{"request_id":"r","user":"u","endpoint":"/e","limits":[{"key":"rl:{u:a}:r","rule":"r","algorithm":"token_bucket","limit":10,"window_ms":1000,"burst":20,"cost":1,"per_user":true,"penalty":{"detection_window_ms":3600000,"violation_threshold":3,"multipliers":[1,2]}}]}`))
	f.Add([]byte(`{"limits":[{"key":"k","algorithm":"sliding_log","limit":1e3,"window_ms":-1}]}`))
	f.Add([]byte(`{"user":"jos\u00e9 \ud83d\ude00","endpoint":"/caf\u00e9","limits":[{"key":"k\u0000","algorithm":"fixed_window","limit":1,"window_ms":1,"log_only":true}]}`))
	f.Add([]byte("{\"user\":\"\xff\",\"limits\":[{\"key\":\"k\xc3\",\"algorithm\":\"fixed_window\",\"limit\":1,\"window_ms\":1}]}"))
	f.Add([]byte(`{"op":"return","limits":[{"key":"k","algorithm":"sliding_log","limit":9,"window_ms":1000,"lease":{"size":5,"ttl_ms":100},"lease_return":{"tag":3,"granted":5,"units":2}}]}`))
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
		again, err := DecodeCheckRequest(AppendCheckRequestFrom(nil, &req))
		if err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, req) {
			t.Fatalf("round trip changed the request:\n got %+v\nwant %+v", again, req)
		}
	})
}

// inRange maps any n onto lo..hi.
func inRange(n, lo, hi int64) int64 {
	u := uint64(n) % uint64(hi-lo+1)
	return lo + int64(u)
}

// What the plugin encodes, the bridge decodes to the same request: every
// field, whatever bytes the client-controlled strings hold (they come back
// UTF-8, or are left out when they cannot).
func FuzzCheckRequest_RoundTrip(f *testing.F) {
	f.Add("req-1", "josé", "/v1/café", "rl:{u:jos\xc3\xa9}:chat", "chat", uint8(1), int64(10), int64(60_000), int64(20), int64(1), true, false, int64(3600_000), int64(3), []byte{1, 2, 4}, int64(-1))
	f.Add("\xff", "\xff", strings.Repeat("/", 600), "k\"\\\n", "tier.free.0", uint8(4), int64(-1), int64(0), int64(0), int64(0), false, true, int64(0), int64(0), []byte{}, int64(-1))
	f.Add("r", "u", "/e", "rl:{g}:t", "t", uint8(3), int64(50), int64(1000), int64(50), int64(1), false, false, int64(0), int64(0), []byte{}, int64(5000))
	f.Add("r", "u", "/e", "rl:{g}:t", "t", uint8(0), int64(50), int64(1000), int64(50), int64(1), false, false, int64(0), int64(0), []byte{}, int64(0))
	f.Fuzz(func(t *testing.T, id, user, endpoint, key, rule string, alg uint8, limit, window, burst, cost int64, logOnly, perUser bool, penWindow, penThreshold int64, mults []byte, maxDelay int64) {
		wantKey, wantRule := validPerByte(key), validPerByte(rule)
		if key == "" || len(wantKey) > MaxKeyLen || len(wantRule) > MaxRuleNameLen+8 {
			return // the plugin never builds such keys or names
		}
		spec := LimitSpec{
			Algorithm: Algorithm(1 + alg%4), Limit: inRange(limit, 1, MaxLimitValue), WindowMS: inRange(window, 1, MaxWindowMS),
			Burst: inRange(burst, 1, MaxLimitValue), Cost: inRange(cost, 1, MaxLimitValue),
		}
		if n := len(mults); n > 0 {
			pen := &Penalty{Enabled: true, DetectionWindowMS: inRange(penWindow, 1, MaxWindowMS), ViolationThreshold: inRange(penThreshold, 1, MaxViolations)}
			for _, m := range mults[:min(n, MaxMultipliers)] {
				pen.Multipliers = append(pen.Multipliers, 1+int64(m))
			}
			spec.Penalty = pen
		}
		plain := spec
		plain.Penalty = nil
		action, other := Reject, LogOnly
		if logOnly {
			action, other = LogOnly, Reject
		}
		// maxDelay >= 0 makes the enforced one of the two a throttle limit
		// (a sliding window never is one).
		throttle := maxDelay >= 0 && spec.Algorithm != SlidingWindow
		if throttle {
			maxDelay = inRange(maxDelay, 0, MaxMaxDelayMS)
		} else {
			maxDelay = 0
		}
		limits := []PlannedLimit{
			{Key: []byte(key), Rule: rule, Spec: &spec, Action: action, PerUser: perUser},
			{Key: []byte(key), Rule: rule, Spec: &plain, Action: other, PerUser: !perUser},
		}
		enforced := &limits[0]
		if logOnly {
			enforced = &limits[1]
		}
		if throttle {
			enforced.Action, enforced.MaxDelayMS = Throttle, maxDelay
		}
		body := AppendCheckRequest(nil, id, user, endpoint, limits)
		got, err := DecodeCheckRequest(body)
		if err != nil {
			t.Fatalf("%v\n%s", err, body)
		}
		want := CheckRequest{Limits: []LimitRequest{
			{Key: wantKey, Rule: wantRule, Spec: spec, LogOnly: logOnly, PerUser: perUser},
			{Key: wantKey, Rule: wantRule, Spec: plain, LogOnly: !logOnly, PerUser: !perUser},
		}}
		if throttle {
			w := &want.Limits[0]
			if logOnly {
				w = &want.Limits[1]
			}
			w.Throttle, w.MaxDelayMS = true, maxDelay
		}
		if len(id) <= MaxRequestIDLen && utf8.ValidString(id) {
			want.RequestID = id
		}
		if sendOverrideField(user) {
			want.User = user
		}
		if sendOverrideField(endpoint) {
			want.Endpoint = endpoint
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip:\n got %+v\nwant %+v\n%s", got, want, body)
		}
	})
}

// The plugin parses whatever its call-out returns: never panic, never
// report more or fewer decisions than were asked for, and what it reads
// is what the bridge's encoder wrote: an answer that decodes re-encodes to
// one that decodes to the same whole value, every number of every decision.
func FuzzDecodeCheckResponse(f *testing.F) {
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0}]}`), 1)
	f.Add([]byte(`{"allowed":false,"decisions":[{},{}]}`), 2)
	f.Add([]byte(`{"allowed":true,"decisions":{"a":1}}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0,"lease":{"units":5,"ttl_ms":200,"tag":7}}]}`), 1)
	f.Add([]byte(`{"allowed":false,"now_ms":-9223372036854775808,"decisions":[{"allowed":false,"limit":9223372036854775807,"remaining":-1,"reset_ms":1099511627776,"retry_after_ms":9007199254740993}]}`), 1)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"delay_ms":250,"decisions":[{"allowed":true,"limit":10,"remaining":0,"reset_ms":2,"retry_after_ms":0}]}`), 1)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"delay_ms":-3,"decisions":[]}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, want int) {
		if want < 0 || want > MaxLimitsPerCheck {
			return
		}
		var resp CheckResponse
		if err := DecodeCheckResponse(body, want, &resp); err != nil {
			return
		}
		if len(resp.Decisions) != want {
			t.Fatalf("accepted %d decisions, want %d", len(resp.Decisions), want)
		}
		var again CheckResponse
		if err := DecodeCheckResponse(AppendCheckResponse(nil, &resp), want, &again); err != nil {
			t.Fatalf("re-encoded answer does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, resp) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, resp)
		}
	})
}

// A check for a long or non-UTF-8 path still decodes: the override fields
// are left out rather than exceed what the bridge accepts.
func TestAppendCheckRequest_LongOverrideFields(t *testing.T) {
	spec := &LimitSpec{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000, Burst: 3, Cost: 1}
	limits := []PlannedLimit{{Key: []byte("rl:{a:1.2.3.4}:r"), Rule: "r", Spec: spec, Action: Reject}}
	for _, endpoint := range []string{"/" + strings.Repeat("a", 600), "/" + strings.Repeat("\xff", 300), "/short"} {
		req, err := DecodeCheckRequest(AppendCheckRequest(nil, "id", strings.Repeat("u", MaxKeyLen+1), endpoint, limits))
		if err != nil {
			t.Fatalf("endpoint of %d bytes: %v", len(endpoint), err)
		}
		if want := endpoint == "/short"; (req.Endpoint != "") != want || req.User != "" {
			t.Errorf("endpoint of %d bytes: endpoint %q user %q", len(endpoint), req.Endpoint, req.User)
		}
	}
}

// The plugin encodes a check and decodes the answer on every request that
// reaches the bridge: both must stay allocation-free once buffers grew.
// The limits are those of a parsed configuration, as the plugin's are.
// BenchmarkAppendCheckRequest measures a check of two limits, written
// whole (evaluated) and from the kept plan's rendering (kept).
func BenchmarkAppendCheckRequest(b *testing.B) {
	c := mustConfig(b, `{"identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
	  "rules": [
	    {"name": "chat", "match": {"paths": ["/api/v1/chat/**"]}, "algorithm": "token_bucket", "limit": 10, "burst": 20, "window": "1s", "penalty": {"enabled": true}},
	    {"name": "tier-free", "match": {"paths": ["/api/**"]}, "limit": 100, "window": "1m", "action": "log_only"}]}`)
	var pc PlanCache
	var plan Plan
	r := Request{Method: "POST", Path: "/api/v1/chat/send", Headers: mapHeaders{"x-user-id": "jos\xc3\xa9"}}
	pc.Evaluate(c, &r, &plan)
	if len(plan.Limits) != 2 {
		b.Fatalf("%d limits, want 2", len(plan.Limits))
	}
	pc.Keep(c, &r, &plan, 1)
	const rid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	var buf []byte
	b.Run("evaluated", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf = AppendCheckRequest(buf[:0], rid, plan.Identity.User, plan.Endpoint, plan.Limits)
		}
	})
	b.Run("kept", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var ok bool
			if buf, ok = pc.AppendKeptCheck(buf[:0], rid, plan.Identity.User, plan.Endpoint, plan.Limits); !ok {
				b.Fatal("declined")
			}
		}
	})
}

func BenchmarkDecodeCheckResponse(b *testing.B) {
	body := AppendCheckResponse(nil, &CheckResponse{Allowed: true, NowMS: 1700000000123, Decisions: []Decision{
		{Allowed: true, Limit: 20, Remaining: 19, ResetMS: 1700000003123},
		{Allowed: true, Limit: 100, Remaining: 99, ResetMS: 1700000120000},
	}})
	var resp CheckResponse
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := DecodeCheckResponse(body, 2, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// Non-ASCII text reaches the bridge as the same text: per-user overrides
// are set through JSON for "josé" and must match a check for "josé".
// A request id, user or endpoint that is not UTF-8 is left out: no override
// can be set for it, and U+FFFD in place of its bad bytes could match
// another client's.
func TestAppendCheckRequest_UTF8(t *testing.T) {
	spec := &LimitSpec{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000, Burst: 3, Cost: 1}
	limits := []PlannedLimit{{Key: []byte("rl:{u:~00}:r"), Rule: "r", Spec: spec, Action: Reject, PerUser: true}}
	tests := []struct {
		id, user, endpoint             string
		wantID, wantUser, wantEndpoint string
	}{
		{"é-1", "josé", "/café/ü", "é-1", "josé", "/café/ü"},
		{"日本", "ユーザー", "/😀", "日本", "ユーザー", "/😀"},
		{"a\xffb", "bo\xc3b", "/x\xe2\x82", "", "", ""},
		{"\x00\x1f\x7f\"\\", "tab\there", "/\u2028", "\x00\x1f\x7f\"\\", "tab\there", "/\u2028"},
	}
	for _, tc := range tests {
		body := AppendCheckRequest(nil, tc.id, tc.user, tc.endpoint, limits)
		req, err := DecodeCheckRequest(body)
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.user, err, body)
		}
		if req.RequestID != tc.wantID || req.User != tc.wantUser || req.Endpoint != tc.wantEndpoint {
			t.Errorf("sent (%q, %q, %q), decoded (%q, %q, %q), want (%q, %q, %q)\n%s",
				tc.id, tc.user, tc.endpoint, req.RequestID, req.User, req.Endpoint, tc.wantID, tc.wantUser, tc.wantEndpoint, body)
		}
	}
}

// Checks as the plugin writes them take the one-pass reader, and whatever
// it accepts it reads as the general JSON reader does.
func FuzzDecodeCheckRequest_Canonical(f *testing.F) {
	for _, req := range canonicalChecks() {
		f.Add(AppendCheckRequestFrom(nil, &req))
	}
	f.Add([]byte(`{"limits":[{"key":"k","rule":"","algorithm":"fixed_window","limit":1,"window_ms":1,"burst":1,"cost":1,"log_only":false}]}`))
	f.Add([]byte(`{"limits":[{"key":"k","rule":"","algorithm":"fixed_window","limit":1,"window_ms":1,"burst":1,"cost":0,"fill":true}]}`))
	f.Add([]byte(`{"limits":[{"key":"k\u0041","rule":"","algorithm":"fixed_window","limit":1,"window_ms":1,"burst":1,"cost":1}]}`))
	f.Add([]byte(`{"limits":[{"key":"k","rule":"","algorithm":"fixed_window","limit":01,"window_ms":1,"burst":1,"cost":1}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		fast, ok := decodeCanonicalRequest(body)
		if !ok {
			return
		}
		general, err := decodeRequestJSON(body)
		if err != nil {
			t.Fatalf("the one-pass reader accepted what the JSON reader refuses (%v): %q", err, body)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q:\n one-pass %+v\n JSON     %+v", body, fast, general)
		}
	})
}

// canonicalChecks are checks with every field the encoder writes.
func canonicalChecks() []CheckRequest {
	base := LimitRequest{Key: "rl:{u:alice}:api", Rule: "api", Spec: LimitSpec{Algorithm: TokenBucket, Limit: 10, WindowMS: 1000, Burst: 20, Cost: 1}}
	with := func(f func(l *LimitRequest)) LimitRequest {
		l := base
		f(&l)
		return l
	}
	return []CheckRequest{
		{Limits: []LimitRequest{base}},
		{RequestID: "rid-1", User: "josé 😀", Endpoint: "/café/x", Limits: []LimitRequest{
			with(func(l *LimitRequest) { l.LogOnly, l.PerUser = true, true }),
			with(func(l *LimitRequest) {
				l.Spec = LimitSpec{Algorithm: FixedWindow, Limit: 5, Months: 3, WindowMS: 3 * MonthMS, Burst: 5, Cost: 2}
			}),
			with(func(l *LimitRequest) { l.Fill, l.Spec.Cost = true, 0 }),
			with(func(l *LimitRequest) {
				l.Spec.Algorithm, l.MaxDelayMS, l.Throttle = SlidingLog, 250, true
				l.Spec.Penalty = &Penalty{Enabled: true, DetectionWindowMS: 60_000, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4}}
			}),
			with(func(l *LimitRequest) { l.Spec.Lease = Lease{Size: 50, TTLMS: 200} }),
		}},
		{Op: OpReturn, RequestID: "r", Limits: []LimitRequest{with(func(l *LimitRequest) {
			l.Spec.Lease = Lease{Size: 50, TTLMS: 200}
			l.Return = LeaseReturn{Tag: -7, Granted: 50, Units: 12}
		})}},
		{Op: OpRenew, Limits: []LimitRequest{with(func(l *LimitRequest) { l.Spec.Algorithm, l.Rule = SlidingWindow, "" })}},
	}
}

func TestDecodeCheckRequest_CanonicalTakesEncoderOutput(t *testing.T) {
	for _, req := range canonicalChecks() {
		body := AppendCheckRequestFrom(nil, &req)
		got, ok := decodeCanonicalRequest(body)
		if !ok {
			t.Fatalf("the one-pass reader refused the encoder's %s", body)
		}
		if !reflect.DeepEqual(got, req) {
			t.Errorf("%s:\n got %+v\nwant %+v", body, got, req)
		}
	}
	// A string the encoder escapes is read by the general reader.
	req := CheckRequest{User: "a\"b", Limits: canonicalChecks()[0].Limits}
	body := AppendCheckRequestFrom(nil, &req)
	if _, ok := decodeCanonicalRequest(body); ok {
		t.Errorf("the one-pass reader took an escaped string: %s", body)
	}
	if got, err := DecodeCheckRequest(body); err != nil || !reflect.DeepEqual(got, req) {
		t.Errorf("%s: got %+v (%v), want %+v", body, got, err, req)
	}
}

// The bridge's answers take the one-pass reader, and whatever it accepts
// it reads as the general JSON reader does.
func FuzzDecodeCheckResponse_Canonical(f *testing.F) {
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0}]}`), 1)
	f.Add([]byte(`{"allowed":false,"now_ms":-9223372036854775808,"decisions":[{"allowed":false,"limit":9223372036854775807,"remaining":-1,"reset_ms":0,"retry_after_ms":-0}]}`), 1)
	f.Add([]byte(`{"allowed":true,"now_ms":0,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":01,"decisions":[]}`), 0)
	// Past int64 either way, and past uint64: 19, 20 and 21 digits.
	f.Add([]byte(`{"allowed":true,"now_ms":9223372036854775808,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":-9223372036854775809,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":18446744073709551617,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":-184467440737095516160,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0,"lease":{"units":5,"ttl_ms":200,"tag":7}}]}`), 1)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"decisions":[{"allowed":true,"limit":10,"remaining":9,"reset_ms":2,"retry_after_ms":0,"lease":{"units":0,"ttl_ms":200,"tag":7}}]}`), 1)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"delay_ms":250,"decisions":[]}`), 0)
	f.Add([]byte(`{"allowed":true,"now_ms":1,"delay_ms":0,"decisions":[]}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, want int) {
		if want < 0 || want > MaxLimitsPerCheck {
			return
		}
		var fast, general CheckResponse
		if !decodeCanonicalResponse(body, want, &fast) {
			return
		}
		if err := decodeResponseJSON(body, want, &general); err != nil {
			t.Fatalf("the one-pass reader accepted what the JSON reader refuses (%v): %q", err, body)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%q:\n one-pass %+v\n JSON     %+v", body, fast, general)
		}
	})
}

func TestDecodeCheckResponse_CanonicalTakesEncoderOutput(t *testing.T) {
	for _, resp := range []CheckResponse{
		{Allowed: true, NowMS: 1_700_000_000_123, Decisions: []Decision{{Allowed: true, Limit: 10, Remaining: 9, ResetMS: 1_700_000_060_000}}},
		{Allowed: false, NowMS: -1, Decisions: []Decision{{Limit: 1 << 62, Remaining: -5, RetryAfterMS: 999}, {Allowed: true, Limit: 0}}},
		{Allowed: true, NowMS: 5, Decisions: []Decision{{Allowed: true, Limit: 9, Lease: LeaseGrant{Units: 50, TTLMS: 200, Tag: -3}}, {Allowed: true}}},
		{Allowed: true, NowMS: 5, DelayMS: 1, Decisions: []Decision{{Allowed: true, Limit: 9}}},
		{Allowed: true},
	} {
		var got CheckResponse
		if !decodeCanonicalResponse(AppendCheckResponse(nil, &resp), len(resp.Decisions), &got) {
			t.Fatalf("the one-pass reader refused the encoder's %+v", resp)
		}
		if len(resp.Decisions) == 0 {
			resp.Decisions = got.Decisions // nil and empty alike
		}
		if !reflect.DeepEqual(got, resp) {
			t.Errorf("got %+v, want %+v", got, resp)
		}
	}
}

// A check of a parsed configuration's limits goes out with the heads
// rendered at parse time, byte for byte what rendering them per request
// writes; a limit changed since, or one not from the configuration, is
// rendered anew.
func TestAppendCheckRequest_Heads(t *testing.T) {
	c := mustConfig(t, `{
	  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "tenant_header": "x-tenant"},
	  "tiers": {"header": "x-tier", "default": "free", "list": [
	    {"name": "free", "limit": 100, "window": "1m", "action": "log_only"},
	    {"name": "gold", "scope": "tenant", "algorithm": "token_bucket", "limit": 1000, "burst": 1500, "window": "1m",
	     "lease": {"size": 10, "ttl": "2s"}, "endpoints": {"/api/bulk/**": {"limit": 50, "window": "1h"}, "/api/one": 50}}]},
	  "categories": [{"name": "chat", "paths": ["/api/chat/**"], "limit": 9, "window": "10s", "algorithm": "sliding_log",
	    "penalty": {"enabled": true}}],
	  "rules": [
	    {"name": "writes", "match": {"methods": ["POST"]}, "scope": "global", "limit": 20, "window": "1s", "cost": 2},
	    {"name": "slow", "match": {"paths": ["/api/**"]}, "limit": 3, "window": "1s", "action": "throttle", "max_delay": "2s"}
	  ]}`)
	var limits []PlannedLimit
	for _, r := range []Request{
		{Method: "POST", Path: "/api/chat/x", Headers: mapHeaders{"x-user-id": "alice"}},
		{Method: "GET", Path: "/api/bulk/a", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "gold", "x-tenant": "acme"}},
		{Method: "GET", Path: "/api/one", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "gold", "x-tenant": "acme"}},
		{Method: "GET", Path: "/api/two", Headers: mapHeaders{"x-user-id": "bob", "x-tier": "gold", "x-tenant": "acme"}},
	} {
		var plan Plan
		c.Evaluate(&r, &plan)
		for _, l := range plan.Limits {
			l.Key = append([]byte(nil), l.Key...)
			limits = append(limits, l)
		}
	}
	if len(limits) != 10 {
		t.Fatalf("%d limits, want 10", len(limits))
	}
	for i := range limits {
		l := &limits[i]
		if !l.head.fits(l.Rule, l.Spec, l.Action == LogOnly, l.PerUser) {
			t.Fatalf("limit %s: its head is missing or does not fit", l.Rule)
		}
		switch i % 3 { // what a filter sets before encoding
		case 1:
			l.AskLease = l.Spec.Lease.Size > 0
			l.Return = LeaseReturn{Tag: 7, Granted: 10, Units: 4}
		case 2:
			l.MaxDelayMS = 0
		}
	}
	rendered := func(ls []PlannedLimit) string {
		fresh := slices.Clone(ls)
		for i := range fresh {
			fresh[i].head = nil
		}
		return string(AppendCheckRequest(nil, "rid", "alice", "/api/x", fresh))
	}
	if got, want := string(AppendCheckRequest(nil, "rid", "alice", "/api/x", limits)), rendered(limits); got != want {
		t.Fatalf("with heads:\n%s\nrendered:\n%s", got, want)
	}
	if _, err := DecodeCheckRequest(AppendCheckRequest(nil, "rid", "alice", "/api/x", limits)); err != nil {
		t.Fatal(err)
	}

	// Each field a head holds, changed after parsing, is sent as changed.
	for _, change := range []func(l *PlannedLimit){
		func(l *PlannedLimit) { l.Rule = strings.Clone(l.Rule) + "2" },
		func(l *PlannedLimit) { l.Action = LogOnly },
		func(l *PlannedLimit) { l.PerUser = !l.PerUser },
		func(l *PlannedLimit) { l.Spec.Algorithm = FixedWindow },
		func(l *PlannedLimit) { l.Spec.Limit++ },
		func(l *PlannedLimit) { l.Spec.WindowMS++ },
		func(l *PlannedLimit) { l.Spec.Burst++ },
		func(l *PlannedLimit) { l.Spec.Cost++ },
	} {
		l := limits[2] // the category "chat": reject, per user
		spec := *l.Spec
		l.Spec = &spec
		change(&l)
		one := []PlannedLimit{l}
		if got, want := string(AppendCheckRequest(nil, "rid", "alice", "/api/x", one)), rendered(one); got != want {
			t.Errorf("changed limit: sent\n%s\nwant\n%s", got, want)
		}
	}
}
