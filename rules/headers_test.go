package rules

import (
	"strings"
	"testing"
)

func render(t *testing.T, h HeaderConfig, l *PlannedLimit, d *Decision, now int64, denied bool) map[string]string {
	t.Helper()
	h.compile()
	var out ResponseHeaders
	h.Render(&out, l, d, now, denied)
	m := map[string]string{}
	for i := 0; i < out.N; i++ {
		m[out.Names[i]] = string(out.Values[i])
	}
	return m
}

func TestHeaderConfig_Render(t *testing.T) {
	spec := &LimitSpec{Algorithm: TokenBucket, Limit: 100, WindowMS: 60_000}
	l := &PlannedLimit{Rule: "tier.free", Spec: spec}
	now := int64(1_700_000_000_000)
	allowed := &Decision{Allowed: true, Limit: 100, Remaining: 42, ResetMS: now + 30_500}
	denied := &Decision{Allowed: false, Limit: 100, Remaining: 0, ResetMS: now + 59_000, RetryAfterMS: 1_200}

	got := render(t, HeaderConfig{Prefix: "X-RateLimit-", RetryAfter: true}, l, allowed, now, false)
	want := map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "42", "X-RateLimit-Reset": "1700000031"}
	if len(got) != len(want) {
		t.Errorf("allowed: got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("allowed %s: got %q, want %q", k, got[k], v)
		}
	}
	got = render(t, HeaderConfig{Prefix: "RL-", RetryAfter: true, Strategy: true, Draft: true}, l, denied, now, true)
	for k, v := range map[string]string{
		"RL-Limit": "100", "RL-Remaining": "0", "RL-Strategy": "token_bucket", "Retry-After": "2",
		"RateLimit-Policy": `"tier.free";q=100;w=60`, "RateLimit": `"tier.free";r=0;t=2`,
	} {
		if got[k] != v {
			t.Errorf("denied %s: got %q, want %q", k, got[k], v)
		}
	}
	if got := render(t, HeaderConfig{Prefix: "X-", RetryAfter: false}, l, denied, now, true); got["Retry-After"] != "" {
		t.Error("Retry-After written although disabled")
	}
	if got := render(t, HeaderConfig{Disabled: true}, l, allowed, now, false); len(got) != 0 {
		t.Errorf("disabled headers written: %v", got)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct{ retry, reset, want int64 }{{1, 0, 1}, {1000, 0, 1}, {1001, 0, 2}, {0, 2500, 3}, {0, -5, 1}} {
		d := &Decision{RetryAfterMS: tc.retry, ResetMS: tc.reset}
		if got := RetryAfterSeconds(d, 0); got != tc.want {
			t.Errorf("retry %d reset %d: got %d, want %d", tc.retry, tc.reset, got, tc.want)
		}
	}
}

func TestHeadline(t *testing.T) {
	l := []PlannedLimit{{Action: Reject}, {Action: LogOnly}, {Action: Reject}, {Action: Reject}}
	d := []Decision{
		{Allowed: true, Remaining: 5, Limit: 10},
		{Allowed: false, RetryAfterMS: 99_000}, // log_only: never the headline
		{Allowed: true, Remaining: 2, Limit: 50},
		{Allowed: true, Remaining: 2, Limit: 20},
	}
	if got := Headline(l, d); got != 3 {
		t.Errorf("allowed headline: %d, want 3 (least remaining, then smallest limit)", got)
	}
	d[0] = Decision{Allowed: false, RetryAfterMS: 1000}
	d[2] = Decision{Allowed: false, RetryAfterMS: 5000}
	if got := Headline(l, d); got != 2 {
		t.Errorf("denied headline: %d, want 2 (longest wait)", got)
	}
	if got := Headline(l[1:2], d[1:2]); got != -1 {
		t.Errorf("only log_only limits: %d, want -1", got)
	}
}

func TestConfig_AppendDenyBody(t *testing.T) {
	c := &Config{}
	l := &PlannedLimit{Rule: "tier.free", Spec: &LimitSpec{WindowMS: 60_000}}
	d := &Decision{Limit: 100, ResetMS: 1_700_000_060_000, RetryAfterMS: 30_000}
	body := string(c.AppendDenyBody(nil, l, d, 1_700_000_030_000, `r"1`))
	want := `{"error":{"code":"RATE_LIMITED","message":"Rate limit exceeded: 100 requests per 1m allowed.","details":{"limit":100,"remaining":0,"reset_at":1700000060,"retry_after":30,"rule":"tier.free"},"request_id":"r\"1"}}`
	if body != want {
		t.Errorf("got  %s\nwant %s", body, want)
	}
	c.Deny.Message = "Slow down"
	if !strings.Contains(string(c.AppendDenyBody(nil, l, d, 0, "")), `"message":"Slow down"`) {
		t.Error("custom message not used")
	}
	if got := string(AppendUnavailableBody(nil, "timeout", "r1")); !strings.Contains(got, `"code":"SERVICE_UNAVAILABLE"`) || !strings.Contains(got, `"reason":"timeout"`) {
		t.Errorf("unavailable body: %s", got)
	}
}

// BenchmarkHeaderConfig_Render is the headers of an allowed request, the
// plugin's call-out path, with the default configuration.
func BenchmarkHeaderConfig_Render(b *testing.B) {
	h := HeaderConfig{Prefix: "X-RateLimit-", RetryAfter: true}
	h.compile()
	l := &PlannedLimit{Rule: "tier.free", Spec: &LimitSpec{Algorithm: TokenBucket, Limit: 1000, WindowMS: 60_000}}
	now := int64(1_700_000_000_000)
	d := &Decision{Allowed: true, Limit: 1000, Remaining: 742, ResetMS: now + 30_500}
	var out ResponseHeaders
	b.ReportAllocs()
	for b.Loop() {
		h.Render(&out, l, d, now, false)
	}
	if out.N != 3 {
		b.Fatalf("%d headers", out.N)
	}
}
