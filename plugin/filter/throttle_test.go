package filter

import (
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

const throttleConfig = `{
  "bridge": {"cluster": "bridge"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "throttle": {"max_waiting": 2},
  "rules": [{"name": "hooks", "match": {"paths": ["/hooks/**"]}, "limit": 5, "window": "1s",
             "algorithm": "fixed_window", "action": "throttle", "max_delay": "2s"}]
}`

func newThrottlePlugin(t *testing.T) (*fakeHost, *Plugin) {
	t.Helper()
	return startPlugin(t, throttleConfig)
}

// delayedAnswer allows the last check after delayMS.
func delayedAnswer(now, delayMS int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: now, DelayMS: delayMS,
		Decisions: []rules.Decision{{Allowed: true, Limit: 5, Remaining: 0, ResetMS: now + delayMS + 1000}}}))
}

func throttleDenied(now, retryMS int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: false, NowMS: now,
		Decisions: []rules.Decision{{Allowed: false, Limit: 5, Remaining: 0, ResetMS: now + 3000, RetryAfterMS: retryMS}}}))
}

func hook(user string) map[string]string {
	return map[string]string{":path": "/hooks/in", "x-user-id": user}
}

// maxDelaySent is the max_delay_ms of the last check's only limit.
func maxDelaySent(t *testing.T, h *fakeHost) int64 {
	t.Helper()
	req, err := rules.DecodeCheckRequest([]byte(h.calls[len(h.calls)-1].body))
	if err != nil || !req.Limits[0].Throttle {
		t.Fatalf("check: %+v %v", req, err)
	}
	return req.Limits[0].MaxDelayMS
}

// TestStream_ThrottleHolds: a request the bridge allows after a delay stays
// paused until the tick that finds it due, which resumes it in its own
// context, and its response says how long it waited.
func TestStream_ThrottleHolds(t *testing.T) {
	h, p := newThrottlePlugin(t)
	s, a := h.request(p, 7, hook("alice"))
	if a != proxywasm.Pause || maxDelaySent(t, h) != 2000 {
		t.Fatalf("action %v, max delay %d", a, maxDelaySent(t, h))
	}
	h.answer(p, "200", delayedAnswer(h.nowMS, 300))
	if h.resumed != 0 || h.local != nil {
		t.Fatalf("resumed %d local %+v: want the request held", h.resumed, h.local)
	}
	if h.tickMS != 300 || p.thr.next != h.nowMS+300 {
		t.Fatalf("tick period %d, next %d: want 300 from now", h.tickMS, p.thr.next-h.nowMS)
	}
	if h.counters[MetricThrottled] != 1 || h.counters[MetricThrottleDelayMS] != 300 || h.counters[MetricThrottleWaiting] != 1 ||
		!slices.Equal(h.samples[MetricThrottleDelay], []int64{300}) {
		t.Fatalf("metrics %v %v", h.counters, h.samples)
	}
	if last := h.logs[len(h.logs)-1]; !strings.Contains(last, `"event_type":"throttled"`) || !strings.Contains(last, `"delay_ms":300`) {
		t.Fatalf("event: %s", last)
	}
	h.nowMS += 299
	p.OnTick()
	if h.resumed != 0 {
		t.Fatal("resumed a millisecond early")
	}
	h.tick(p)
	if h.resumed != 1 || !slices.Equal(h.resumedIDs, []uint32{7}) || h.effective != 1 {
		t.Fatalf("resumed %d in %v, effective now %d: want stream 7 resumed, then the root", h.resumed, h.resumedIDs, h.effective)
	}
	if h.counters[MetricThrottleWaiting] != 0 || p.thr.places != 0 {
		t.Fatalf("waiting %d places %d after the resume", h.counters[MetricThrottleWaiting], p.thr.places)
	}
	if p.thr.next != p.thr.slowAt {
		t.Errorf("with nothing held the tick fires in %d ms, want when the period's work is due (%d)", p.thr.next-h.nowMS, p.thr.slowAt-h.nowMS)
	}
	s.OnResponseHeaders(0, false)
	got := map[string]string{}
	for _, kv := range h.respHeaders {
		got[kv[0]] = kv[1]
	}
	if got["X-RateLimit-Delay"] != "300" || got["X-RateLimit-Remaining"] != "0" {
		t.Fatalf("response headers %v", got)
	}
	s.OnDone()
}

// TestStream_ThrottleOrder: held requests resume in the order they are
// due, each at its time, whatever order their answers came in; the tick
// is set for the next one due.
func TestStream_ThrottleOrder(t *testing.T) {
	h, p := newThrottlePlugin(t)
	h.config = []byte(strings.Replace(throttleConfig, `"max_waiting": 2`, `"max_waiting": 10`, 1))
	p.OnPluginStart(len(h.config))
	delays := []int64{500, 120, 900, 130, 40}
	for i, d := range delays {
		h.request(p, uint32(10+i), hook("u"))
		h.answer(p, "200", delayedAnswer(h.nowMS, d))
	}
	if h.tickMS != 40 {
		t.Fatalf("tick %d, want 40 (the first due)", h.tickMS)
	}
	start := h.nowMS
	var at []int64
	for h.resumed < len(delays) {
		before := h.resumed
		h.tick(p)
		for range h.resumed - before {
			at = append(at, h.nowMS-start)
		}
		if h.nowMS-start > 2000 {
			t.Fatal("not all resumed")
		}
	}
	if want := []uint32{14, 11, 13, 10, 12}; !slices.Equal(h.resumedIDs, want) {
		t.Errorf("resumed %v, want %v", h.resumedIDs, want)
	}
	if want := []int64{40, 120, 130, 500, 900}; !slices.Equal(at, want) {
		t.Errorf("resumed at %v, want %v", at, want)
	}
}

// TestStream_ThrottleBound: with every place taken, a request is checked
// as one that cannot wait; refused, it is counted apart, and its refusal
// is not cached (it was told less than it may wait). A held request whose
// client goes away frees its place.
func TestStream_ThrottleBound(t *testing.T) {
	h, p := newThrottlePlugin(t)
	a, _ := h.request(p, 2, hook("a"))
	b, _ := h.request(p, 3, hook("b"))
	if maxDelaySent(t, h) != 2000 {
		t.Fatal("second request: want a wait allowed")
	}
	h.request(p, 4, hook("c")) // two checks in flight hold both places
	if maxDelaySent(t, h) != 0 {
		t.Fatalf("third request: max delay %d, want 0 (no place)", maxDelaySent(t, h))
	}
	h.answer(p, "200", throttleDenied(h.nowMS, 1500))
	if h.local == nil || h.local.status != 429 || h.counters[MetricThrottleFull] != 1 || h.counters[MetricThrottleTooLong] != 0 {
		t.Fatalf("third: %+v %v", h.local, h.counters)
	}
	// Answer a (held) and b (held).
	h.callStatus, h.callBody = "200", []byte(delayedAnswer(h.nowMS, 800))
	p.OnHTTPCallResponse(1, 3, len(h.callBody), 0)
	p.OnHTTPCallResponse(2, 3, len(h.callBody), 0)
	if p.thr.places != 2 || len(p.thr.held) != 2 {
		t.Fatalf("places %d held %d", p.thr.places, len(p.thr.held))
	}
	// c's refusal was not cached: the next request asks the bridge.
	calls := len(h.calls)
	h.request(p, 5, hook("c"))
	if len(h.calls) != calls+1 || maxDelaySent(t, h) != 0 {
		t.Fatalf("a refusal told to wait 0 was cached, or a place was free")
	}
	// a's client goes away: its place is free for the next request.
	a.OnDone()
	if p.thr.places != 1 || len(p.thr.held) != 1 || h.counters[MetricThrottleWaiting] != 1 {
		t.Fatalf("after a left: places %d held %d waiting %d", p.thr.places, len(p.thr.held), h.counters[MetricThrottleWaiting])
	}
	h.request(p, 6, hook("d"))
	if maxDelaySent(t, h) != 2000 {
		t.Fatal("a freed place was not taken")
	}
	h.nowMS += 800
	h.tick(p)
	if !slices.Equal(h.resumedIDs, []uint32{3}) {
		t.Fatalf("resumed %v, want only b", h.resumedIDs)
	}
	b.OnDone()
}

// TestStream_ThrottleTooLong: a throttle limit that would wait more than
// its max_delay refuses; the refusal is counted, logged with its action,
// and cached until the wait would fit.
func TestStream_ThrottleTooLong(t *testing.T) {
	h, p := newThrottlePlugin(t)
	h.request(p, 2, hook("a"))
	h.answer(p, "200", throttleDenied(h.nowMS, 700))
	if h.local == nil || h.local.status != 429 || h.local.headers["Retry-After"] != "1" || h.counters[MetricThrottleTooLong] != 1 || p.thr.places != 0 {
		t.Fatalf("refusal %+v, counters %v, places %d", h.local, h.counters, p.thr.places)
	}
	if last := h.logs[len(h.logs)-1]; !strings.Contains(last, `"event_type":"blocked"`) || !strings.Contains(last, `"action":"throttle"`) {
		t.Fatalf("event: %s", last)
	}
	calls := len(h.calls)
	h.request(p, 3, hook("a"))
	if len(h.calls) != calls || h.local == nil || h.local.status != 429 {
		t.Fatalf("not refused from the cache: %d call-outs, %+v", len(h.calls)-calls, h.local)
	}
	h.nowMS += 700
	h.request(p, 4, hook("a"))
	if len(h.calls) != calls+1 {
		t.Fatal("the cache refused past the time the wait fits")
	}
}

// TestStream_ThrottleBridgeFailure: requests held keep their slots and
// pass when due; a check the bridge fails is answered by the failure
// mode at once and frees its place.
func TestStream_ThrottleBridgeFailure(t *testing.T) {
	h, p := newThrottlePlugin(t)
	h.request(p, 2, hook("a"))
	h.answer(p, "200", delayedAnswer(h.nowMS, 400))
	h.request(p, 3, hook("b"))
	p.OnHTTPCallResponse(uint32(len(h.calls)), 0, 0, 0) // bridge unreachable
	if !slices.Equal(h.resumedIDs, []uint32{3}) || h.counters[MetricFailOpen] != 1 || p.thr.places != 1 {
		t.Fatalf("failed check: resumed %v, counters %v, places %d", h.resumedIDs, h.counters, p.thr.places)
	}
	h.nowMS += 400
	h.tick(p)
	if !slices.Equal(h.resumedIDs, []uint32{3, 2}) || p.thr.places != 0 {
		t.Fatalf("held: resumed %v, places %d", h.resumedIDs, p.thr.places)
	}
}

// TestPlugin_ThrottleTickKeepsPeriodWork: while requests are held the tick
// fires at their due times, but the work of the tick's own period runs
// once a period.
func TestPlugin_ThrottleTickKeepsPeriodWork(t *testing.T) {
	h, p := newThrottlePlugin(t)
	start := h.nowMS
	ticks, periods, last := 0, 0, p.thr.slowAt
	for h.nowMS-start < 3000 {
		h.request(p, uint32(100+ticks), hook("u"))
		h.answer(p, "200", delayedAnswer(h.nowMS, 70))
		h.tick(p)
		ticks++
		if p.thr.slowAt != last {
			periods, last = periods+1, p.thr.slowAt
		}
	}
	if ticks < 30 || periods != 3 {
		t.Fatalf("%d ticks, the period's work %d times in %d ms: want it once a second", ticks, periods, h.nowMS-start)
	}
	h.nowMS += 70
	h.tick(p)
	if h.resumed != ticks {
		t.Fatalf("resumed %d of %d", h.resumed, ticks)
	}
}
