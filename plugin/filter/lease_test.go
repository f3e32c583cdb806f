package filter

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

const leaseConfig = `{
  "failure_mode": "fail_closed",
  "bridge": {"cluster": "bridge", "timeout": "150ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}]},
  "local_cache": {"max_entries": 64},
  "rules": [
    {"name": "hot", "match": {"paths": ["/hot/**"]}, "scope": "global", "limit": 1000, "window": "1m",
     "algorithm": "fixed_window", "lease": {"size": 10, "ttl": "1s"}},
    {"name": "plain", "match": {"paths": ["/hot/mixed"]}, "scope": "global", "limit": 1000, "window": "1m"}
  ]
}`

const hotKey = "rl:{g}:hot"

func newLeasePlugin(t *testing.T) (*fakeHost, *Plugin) {
	t.Helper()
	return startPlugin(t, leaseConfig)
}

// otherVM is a second worker VM of h's proxy: its own plugin, the same
// shared data.
func otherVM(t *testing.T, h *fakeHost) (*fakeHost, *Plugin) {
	t.Helper()
	h2, p2 := newLeasePlugin(t)
	h2.shared, h2.cas, h2.casSeq = h.shared, h.cas, h.casSeq
	h2.nowMS = h.nowMS
	return h2, p2
}

func grantAnswer(now, units, ttl, tag, remaining int64) string {
	return string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: now, Decisions: []rules.Decision{
		{Allowed: true, Limit: 1000, Remaining: remaining, ResetMS: now + 30_000, Lease: rules.LeaseGrant{Units: units, TTLMS: ttl, Tag: tag}},
	}}))
}

// answerCall delivers a bridge answer to call-out id.
func (h *fakeHost) answerCall(p *Plugin, id int, status, body string) {
	h.callStatus, h.callBody = status, []byte(body)
	p.OnHTTPCallResponse(uint32(id), 3, len(body), 0)
}

func (h *fakeHost) hot(p *Plugin, ctxID uint32) proxywasm.Action {
	_, a := h.request(p, ctxID, map[string]string{":path": "/hot/x"})
	return a
}

// A leased limit asks for a lease with its check; what is granted answers
// the next requests with no call-out, with headers counting what the
// proxy holds; at half the size a renewal goes out in the background, and
// its grant is spent after the first.
func TestLease_SpentWithoutCallouts(t *testing.T) {
	h, p := newLeasePlugin(t)
	if a := h.hot(p, 2); a != proxywasm.Pause || len(h.calls) != 1 {
		t.Fatalf("first request: %v, %d call-outs", a, len(h.calls))
	}
	if body := h.calls[0].body; !strings.Contains(body, `"lease":{"size":10,"ttl_ms":1000}`) {
		t.Fatalf("no lease asked for: %s", body)
	}
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	if h.resumed != 1 || h.counters[MetricLeaseGrants] != 1 || h.counters[MetricUnitsGranted] != 10 {
		t.Fatalf("grant: resumed %d, counters %v", h.resumed, h.counters)
	}
	for i := range 10 {
		if a := h.hot(p, uint32(3+i)); a != proxywasm.Continue {
			t.Fatalf("request %d from the lease: %v", i, a)
		}
	}
	if got := h.counters[MetricLeaseHits]; got != 10 {
		t.Fatalf("%d answered from the lease, want 10", got)
	}
	// The renewal went out when 5 were left, once.
	if len(h.calls) != 2 || !strings.Contains(h.calls[1].body, `"op":"renew"`) || !strings.Contains(h.calls[1].body, `"lease":{"size":10`) {
		t.Fatalf("call-outs %d, want the first and one renewal: %+v", len(h.calls), h.calls[1:])
	}
	// Spent out, with the renewal awaited: the request asks the bridge,
	// without a lease of its own.
	if a := h.hot(p, 20); a != proxywasm.Pause || strings.Contains(h.calls[2].body, `"lease"`) {
		t.Fatalf("request after the lease: %v, body %s", a, h.calls[2].body)
	}
	h.answerCall(p, 2, "200", grantAnswer(h.nowMS, 10, 1000, 78, 979))
	if a := h.hot(p, 21); a != proxywasm.Continue {
		t.Fatalf("request from the renewed lease: %v", a)
	}
	if h.counters[MetricUnitsSpent] != 11 || h.counters[MetricUnitsGranted] != 20 {
		t.Errorf("counters %v", h.counters)
	}
}

// The headers of a request answered from a lease: the store's remaining
// at the grant plus what the proxy still holds.
func TestLease_Headers(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	s, _ := h.request(p, 3, map[string]string{":path": "/hot/x"})
	s.OnResponseHeaders(0, true)
	got := map[string]string{}
	for _, kv := range h.respHeaders {
		got[kv[0]] = kv[1]
	}
	if got["X-RateLimit-Limit"] != "1000" || got["X-RateLimit-Remaining"] != "998" {
		t.Errorf("headers %v, want limit 1000 remaining 989+9", got)
	}
}

// Two worker VMs spend one lease: every unit once, whichever VM spends it.
func TestLease_SharedByVMs(t *testing.T) {
	h, p := newLeasePlugin(t)
	h2, p2 := otherVM(t, h)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	served := 0
	for i := range 20 {
		hh, pp := h, p
		if i%2 == 1 {
			hh, pp = h2, p2
		}
		if hh.hot(pp, uint32(10+i)) == proxywasm.Continue {
			served++
		}
	}
	if served != 10 {
		t.Fatalf("%d served from a lease of 10 by two VMs", served)
	}
}

// A CAS conflict (another VM wrote between the read and the write) is
// retried, never lost or spent twice.
func TestLease_CASConflict(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	k := p.slotName(rules.Hash([]byte(hotKey)), 64)
	before := string(h.shared[k])
	// Bump the token as a concurrent write of the same value would.
	*h.casSeq++
	h.cas[k] = *h.casSeq
	if h.hot(p, 3) != proxywasm.Continue {
		t.Fatal("not answered from the lease after a conflict")
	}
	var e slotEntry
	if !parseSlot(h.shared[k], &e) || e.held(h.nowMS) != 9 || string(h.shared[k]) == before {
		t.Fatalf("after one spend: %+v", e)
	}
}

// The first requests of a key no VM has seen: the first VM makes the
// key's slot, with its mark, and asks for a lease; another VM's check goes
// to the bridge without asking, and both spend the one grant.
func TestLease_NewKeyAskedOnce(t *testing.T) {
	h, p := newLeasePlugin(t)
	h2, p2 := otherVM(t, h)
	h.hot(p, 2)
	h2.hot(p2, 2)
	if len(h.calls) != 1 || len(h2.calls) != 1 {
		t.Fatalf("call-outs %d and %d, want one each", len(h.calls), len(h2.calls))
	}
	if !strings.Contains(h.calls[0].body, `"lease"`) || strings.Contains(h2.calls[0].body, `"lease"`) {
		t.Fatalf("checks: %s and %s; want a lease asked by the first only", h.calls[0].body, h2.calls[0].body)
	}
	h2.answerCall(p2, 1, "200", grantAnswer(h.nowMS, 0, 0, 0, 999))
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	if h.hot(p, 3) != proxywasm.Continue || h2.hot(p2, 3) != proxywasm.Continue {
		t.Fatal("the grant does not answer both VMs")
	}
	if g := h.counters[MetricLeaseGrants] + h2.counters[MetricLeaseGrants]; g != 1 {
		t.Errorf("%d grants, want 1", g)
	}
}

// A VM caches a denial into a slot it read as absent while another VM
// makes that slot its key's, with a renewal mark: the first write fails
// and is made again on what the other wrote, rather than replacing it.
func TestLease_DenialIntoNewSlotKeepsMark(t *testing.T) {
	h, p := newLeasePlugin(t)
	h2, p2 := otherVM(t, h)
	// /hot/mixed also matches an unleased limit: its check asks for no
	// lease and leaves the slot absent.
	h.request(p, 2, map[string]string{":path": "/hot/mixed"})
	h.beforeSet = func() { h2.hot(p2, 2) }
	deny := string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: false, NowMS: h.nowMS, Decisions: []rules.Decision{
		{Allowed: false, Limit: 1000, Remaining: 0, ResetMS: h.nowMS + 30_000, RetryAfterMS: 30_000},
		{Allowed: true, Limit: 1000, Remaining: 500, ResetMS: h.nowMS + 30_000},
	}}))
	h.answerCall(p, 1, "200", deny)
	if h.beforeSet != nil {
		t.Fatal("the denial was not cached")
	}
	if len(h2.calls) != 1 || !strings.Contains(h2.calls[0].body, `"lease"`) {
		t.Fatalf("the other VM's check: %+v, want one asking for a lease", h2.calls)
	}
	var e slotEntry
	if !parseSlot(h.shared[p.slotName(rules.Hash([]byte(hotKey)), 64)], &e) {
		t.Fatal("no slot")
	}
	if e.until <= h.nowMS || !e.leased || e.renewing == 0 {
		t.Fatalf("slot: denied until %d (now %d), leased %v, mark %d; want the denial and the other VM's mark", e.until, h.nowMS, e.leased, e.renewing)
	}
}

// A lease that ended with units is handed back: on the next check of its
// key, or by the tick when no check comes.
func TestLease_EndedUnitsGoBack(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	h.hot(p, 3) // 9 left
	h.nowMS += 1000
	if a := h.hot(p, 4); a != proxywasm.Pause {
		t.Fatalf("request after the lease ended: %v", a)
	}
	if body := h.calls[1].body; !strings.Contains(body, `"lease_return":{"tag":77,"granted":10,"units":9}`) ||
		!strings.Contains(body, `"lease":{"size":10`) {
		t.Fatalf("check after the lease: %s", body)
	}
	h.answerCall(p, 2, "200", grantAnswer(h.nowMS, 10, 1000, 78, 979))
	if h.counters[MetricUnitsReturned] != 9 {
		t.Errorf("returned %d, want 9", h.counters[MetricUnitsReturned])
	}
	// This lease ends unspent, and no check comes: the tick hands it back.
	h.nowMS += 1000
	h.tick(p)
	if len(h.calls) != 3 || !strings.Contains(h.calls[2].body, `"op":"return"`) ||
		!strings.Contains(h.calls[2].body, `"lease_return":{"tag":78,"granted":10,"units":10}`) {
		t.Fatalf("tick: %d call-outs, last %+v", len(h.calls), h.calls[len(h.calls)-1])
	}
	h.answerCall(p, 3, "200", grantAnswer(h.nowMS, 0, 0, 0, 989))
	if h.counters[MetricUnitsReturned] != 19 {
		t.Errorf("returned %d, want 19", h.counters[MetricUnitsReturned])
	}
	h.tick(p)
	if len(h.calls) != 3 {
		t.Errorf("handed back twice: %d call-outs", len(h.calls))
	}
}

// While the bridge fails, a lease keeps serving until it expires; then
// the failure mode answers, and the renewal mark does not stay.
func TestLease_ServesThroughBridgeFailure(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	for i := range 6 {
		if h.hot(p, uint32(3+i)) != proxywasm.Continue {
			t.Fatalf("request %d", i)
		}
	}
	h.answerCall(p, 2, "503", "") // the renewal fails
	for i := range 4 {
		if h.hot(p, uint32(10+i)) != proxywasm.Continue {
			t.Fatalf("request %d after the renewal failed", i)
		}
	}
	h.nowMS += 1000
	if a := h.hot(p, 20); a != proxywasm.Pause || !strings.Contains(h.calls[len(h.calls)-1].body, `"lease"`) {
		t.Fatalf("after the lease: %v (the mark must be gone: a lease is asked for)", a)
	}
	h.answerCall(p, len(h.calls), "503", "")
	if h.local == nil || h.local.status != 503 || h.counters[MetricFailClosed] != 1 {
		t.Fatalf("failure mode not applied: %+v", h.local)
	}
}

// A request that also matches an unleased limit is decided by the bridge
// and asks for no lease.
func TestLease_MixedRequestNeverLeased(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.request(p, 2, map[string]string{":path": "/hot/mixed"})
	if body := h.calls[0].body; strings.Contains(body, "lease") {
		t.Fatalf("a lease asked for: %s", body)
	}
}

// A slot whose lease is being spent keeps it when another key's denial
// or grant hashes there; an ended lease is evicted and handed back.
func TestLease_SlotReuse(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	// A key of the same slot.
	var other []byte
	for i := 0; ; i++ {
		other = []byte("rl:{u:x" + itoaString(i) + "}:hot")
		if rules.Hash(other)%64 == rules.Hash([]byte(hotKey))%64 {
			break
		}
	}
	k := p.slotName(rules.Hash(other), 64)
	p.cacheDenial(p.cfg, other, &rules.Decision{Limit: 5, RetryAfterMS: 1000}, h.nowMS)
	var e slotEntry
	if !parseSlot(h.shared[k], &e) || string(e.key) != hotKey {
		t.Fatalf("a live lease was evicted by a denial: %q", e.key)
	}
	calls := len(h.calls)
	p.install(p.cfg, other, &p.cfg.Rules[0].Spec, &rules.Decision{Limit: 1000, Lease: rules.LeaseGrant{Units: 5, TTLMS: 1000, Tag: 9}}, h.nowMS)
	if len(h.calls) != calls+1 || !strings.Contains(h.calls[calls].body, `"lease_return":{"tag":9,"granted":5,"units":5}`) {
		t.Fatalf("a grant that found the slot taken was not handed back: %+v", h.calls[calls:])
	}
	h.nowMS += 1000 // the lease ended, 10 units unspent
	p.cacheDenial(p.cfg, other, &rules.Decision{Limit: 5, RetryAfterMS: 1000}, h.nowMS)
	if !parseSlot(h.shared[k], &e) || string(e.key) != string(other) {
		t.Fatalf("an ended lease was not evicted: %q", e.key)
	}
	if last := h.calls[len(h.calls)-1].body; !strings.Contains(last, `"key":"rl:{g}:hot"`) || !strings.Contains(last, `"units":10`) {
		t.Fatalf("the evicted lease was not handed back: %s", last)
	}
}

func itoaString(i int) string { return string(itoa(nil, int64(i))) }

// A flood of distinct leased keys keeps to the slots (shared data cannot
// be deleted from): grants that find their slot's lease being spent go
// back at once (or, beyond the calls a VM keeps in flight, are counted as
// not handed back), and nothing is kept beyond local_cache.max_entries.
func TestLease_FloodOfKeysStaysBounded(t *testing.T) {
	h, p := newLeasePlugin(t)
	for i := range 1000 {
		key := []byte("rl:{u:flood" + itoaString(i) + "}:hot")
		p.install(p.cfg, key, &p.cfg.Rules[0].Spec, &rules.Decision{Limit: 1000, Lease: rules.LeaseGrant{Units: 10, TTLMS: 1000, Tag: int64(i)}}, h.nowMS)
	}
	if n := len(h.shared); n > 64 {
		t.Fatalf("%d shared data keys for 64 slots", n)
	}
	installed := 0
	for _, v := range h.shared {
		var e slotEntry
		if parseSlot(v, &e) && e.held(h.nowMS) > 0 {
			installed++
		}
	}
	returns := 0
	for _, c := range h.calls {
		if strings.Contains(c.body, `"op":"return"`) {
			returns++
		}
	}
	if installed > 64 || int64(installed+returns)*10+h.counters[MetricUnitsUnreturned] != 10_000 {
		t.Fatalf("%d leases kept in 64 slots, %d handed back, %d units counted not handed back, of 1000 grants of 10",
			installed, returns, h.counters[MetricUnitsUnreturned])
	}
	// Once they end, every slot takes a new key, handing back the old.
	h.nowMS += 1000
	calls := len(h.calls)
	for i := range 1000 {
		key := []byte("rl:{u:again" + itoaString(i) + "}:hot")
		p.install(p.cfg, key, &p.cfg.Rules[0].Spec, &rules.Decision{Limit: 1000, Lease: rules.LeaseGrant{Units: 10, TTLMS: 1000, Tag: int64(i)}}, h.nowMS)
	}
	if n := len(h.shared); n > 64 {
		t.Fatalf("%d shared data keys for 64 slots", n)
	}
	// The VM's calls are all in flight (nothing answers them here): what
	// the ended leases held is counted as not handed back.
	if len(h.calls) != calls || h.counters[MetricUnitsUnreturned] < int64(installed)*10 {
		t.Fatalf("the ended leases of the first keys: %d more calls, %d units not handed back", len(h.calls)-calls, h.counters[MetricUnitsUnreturned])
	}
}

// After a configuration without the lease, its units are no longer
// spent, and the tick hands them back once the lease ends.
func TestLease_ConfigChangeLeavesNothingStranded(t *testing.T) {
	h, p := newLeasePlugin(t)
	h.hot(p, 2)
	h.answerCall(p, 1, "200", grantAnswer(h.nowMS, 10, 1000, 77, 989))
	h.config = []byte(strings.Replace(leaseConfig, `, "lease": {"size": 10, "ttl": "1s"}`, "", 1))
	if !p.OnPluginStart(len(h.config)) {
		t.Fatalf("config refused: %v", h.logs)
	}
	if a := h.hot(p, 3); a != proxywasm.Pause {
		t.Fatalf("a request under the new configuration was answered from the old lease: %v", a)
	}
	h.answerCall(p, 2, "200", string(rules.AppendCheckResponse(nil, &rules.CheckResponse{Allowed: true, NowMS: h.nowMS,
		Decisions: []rules.Decision{{Allowed: true, Limit: 1000, Remaining: 988}}})))
	h.nowMS += 1000
	h.tick(p)
	if last := h.calls[len(h.calls)-1].body; !strings.Contains(last, `"lease_return":{"tag":77,"granted":10,"units":10}`) {
		t.Fatalf("the old lease was not handed back: %s", last)
	}
}
