package filter

import (
	"net/netip"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// A client refused from the over-limit cache is usually refused many times
// a second, and rendering its 429 (headers, JSON body) and a JSON event for
// each refusal cost most of the proxy's time on that path. Each VM keeps
// the rendering of its most recent refusals instead, one per key in a
// direct-mapped table, valid while the cache entry and the Retry-After it
// shows stay the same; a request then adds only its request id to the
// body. Their blocked events are aggregated: one per key per second, with
// the number of refusals it stands for and the fields of the first of them.

// refusalSlots is how many keys a VM keeps a rendered refusal for.
const refusalSlots = 64

type refusal struct {
	cfg   *rules.Config // the configuration it was rendered under
	key   []byte
	gen   uint32 // counts the keys the slot held, for refusalTag
	until int64  // the cache entry's retry time
	hold  int64  // the cache entry's, when it stops answering
	retry int64  // the Retry-After seconds it shows
	// The reply: its headers, serialized, and its body up to the request id.
	headers []byte
	start   []byte
	// The aggregated event: refusals not yet reported, the second of the
	// last event, and what the next one describes.
	pending                   int64
	eventSec                  int64
	rule, action              string
	limit, resetMS            int64
	requestID, endpoint, user []byte
	ip                        netip.Addr
}

// refuseCached answers s with a 429 for limit i, which the over-limit cache
// holds as refused (decision d) until hold, counted as a cache hit and a
// denial; h is the key's hash, and memo tells that the VM's rendering of
// its refusal is of this key and configuration.
func (s *Stream) refuseCached(i int, d *rules.Decision, hold int64, h uint64, memo bool) {
	p, cfg := s.p, s.cfg
	p.host.IncCounter(p.m.cacheHits)
	p.host.IncCounter(p.m.denied)
	l := &s.plan.Limits[i]
	r := &p.refusals[h%refusalSlots]
	if !memo {
		p.reportRefusals(r, s.nowMS) // what is pending belongs to the key leaving
		r.cfg, r.key, r.until, r.hold = cfg, append(r.key[:0], l.Key...), 0, 0
		if r.gen++; r.gen == 0 {
			// Wrapped: a tag the plan cache keeps could name this key
			// as the one the slot holds.
			p.plans.Reset()
		}
	}
	r.hold = hold
	until, retry := s.nowMS+d.RetryAfterMS, rules.RetryAfterSeconds(d, s.nowMS)
	if r.until != until || r.retry != retry {
		r.until, r.retry = until, retry
		cfg.Headers.Render(&s.respHeaders, l, d, s.nowMS, true)
		r.headers = s.appendLocalHeaders(r.headers[:0])
		s.respHeaders.Reset()
		r.start = cfg.AppendDenyBodyStart(r.start[:0], l, d, s.nowMS)
		r.rule, r.action, r.limit, r.resetMS = l.Rule, l.Action.String(), d.Limit, d.ResetMS
	}
	s.sendRefusal(r, bytesString(s.requestID))
	if r.pending == 0 {
		// The first refusal since the key's last event stands for those
		// the next one reports: its client address is worked out only
		// here, not for every refusal.
		r.requestID = append(r.requestID[:0], s.requestID...)
		r.endpoint = append(r.endpoint[:0], s.plan.Endpoint...)
		r.user = append(r.user[:0], s.plan.Identity.User...)
		r.ip = s.clientIP()
	}
	r.pending++
	if s.nowMS/1000 > r.eventSec {
		p.reportRefusals(r, s.nowMS)
	}
}

// refusalTag names the refusal of limit i of a request's plan, whose key's
// hash is hash: the slot that holds it (the hash modulo refusalSlots), i,
// and how many keys the slot has held. The plan cache keeps it with the
// request's plan, so that refuseAgain finds the slot and knows that it
// still holds the key of limit i without comparing keys.
func (p *Plugin) refusalTag(hash uint64, i int) uint64 {
	// The low byte, a slot, is below refusalSlots: never noRefusal's.
	slot := hash % refusalSlots
	return slot | uint64(min(i, 1<<24-1))<<8 | uint64(p.refusals[slot].gen)<<32
}

// noRefusal tags a kept plan whose request was not refused.
const noRefusal = ^uint64(0)

// refuseAgain answers s from the refusal of a request that read the same
// (kept, its plan, from the VM's plan cache; tag, its refusalTag) when that
// is what refuseCached would answer with nothing to render or report: the
// plan's first enforced limit is the one refused, its refusal still holds
// and shows the same Retry-After, and it is not the first of its second.
// Otherwise it does nothing and returns false.
func (s *Stream) refuseAgain(kept *rules.Plan, tag uint64) bool {
	p := s.p
	if tag == noRefusal {
		return false // kept for a request let through
	}
	if !s.cfg.LocalCache.Enabled || leasable(kept.Limits) {
		return false // a lease is spent before the cache is asked
	}
	r := &p.refusals[uint8(tag)%refusalSlots]
	if r.gen != uint32(tag>>32) || r.cfg != s.cfg || r.pending == 0 {
		return false
	}
	// A limit before the refused one, refused too, is the one refuseCached
	// would answer for.
	i := int(uint32(tag) >> 8)
	if i >= len(kept.Limits) {
		return false
	}
	for j := range i {
		if kept.Limits[j].Action != rules.LogOnly {
			return false
		}
	}
	now := s.now()
	if r.hold <= now || now/1000 > r.eventSec ||
		r.retry != rules.RetryAfterSeconds(&rules.Decision{RetryAfterMS: r.until - now}, now) {
		return false
	}
	s.plan.Limits = s.plan.Limits[:0] // the request's plan is kept's, not this one
	s.sendRefusal(r, s.requestIDView())
	r.pending++
	p.uncounted++
	return true
}

// countDeferred adds to the counters what the two paths most repeated
// leave to the tick: the refusals refuseAgain answered since it last ran,
// to requests, denied and local cache hits, and the requests no limit
// applied to, to requests. A refusal it answers is repeated many times a
// second, and three counter increments, three guest-host crossings, were
// about a tenth of its time on wazero; a request no limit applies to,
// which may be most of a proxy's, made two host calls, one of them the
// increment (a sixth of its time). Counted here, the counters stay in
// step (requests is still at least allowed + denied + ...) and lag by at
// most a tick, a second.
func (p *Plugin) countDeferred() {
	if n := p.uncounted + p.unlimited; n > 0 {
		p.host.AddCounter(p.m.requests, n)
	}
	if n := p.uncounted; n > 0 {
		p.host.AddCounter(p.m.denied, n)
		p.host.AddCounter(p.m.cacheHits, n)
	}
	p.uncounted, p.unlimited = 0, 0
}

// sendRefusal answers s with r's 429, with the request's id rid in the
// body. The id is written after r's rendered start, in the room beyond
// it, rather than the start copied for every refusal: the host copies the
// body before the call returns.
func (s *Stream) sendRefusal(r *refusal, rid string) {
	s.state = stateDone
	n := len(r.start)
	body := rules.AppendDenyBodyEnd(r.start, rid)
	r.start = body[:n] // keeps the room the first refusal grew
	s.sendLocal(s.cfg.Deny.Status, r.headers, body)
}

// appendLocalHeaders appends the serialized headers of a 429: the content
// type and the rate limit headers rendered into s.respHeaders.
func (s *Stream) appendLocalHeaders(dst []byte) []byte {
	s.pairs = append(s.pairs[:0], [2]string{"content-type", "application/json"})
	for j := 0; j < s.respHeaders.N; j++ {
		s.pairs = append(s.pairs, [2]string{s.respHeaders.Names[j], bytesString(s.respHeaders.Values[j])})
	}
	return proxywasm.AppendHeaderMap(dst, s.pairs)
}

// reportRefusals logs r's pending refusals as one blocked event: the first
// refused request's fields, the rule's limit and reset, and their count.
func (p *Plugin) reportRefusals(r *refusal, nowMS int64) {
	if r.pending == 0 {
		return
	}
	b := appendEventHead(p.event[:0], "blocked", nowMS, bytesString(r.requestID), bytesString(r.endpoint), bytesString(r.user), r.ip)
	b = append(b, `,"rule":"`...)
	b = append(b, r.rule...) // a validated name: nothing to escape
	b = append(b, `","action":"`...)
	b = append(b, r.action...)
	b = append(b, `","source":"local_cache","count":`...)
	b = itoa(b, r.pending)
	b = append(b, `,"request_count":`...)
	b = itoa(b, r.limit)
	b = append(b, `,"limit":`...)
	b = itoa(b, r.limit)
	b = append(b, `,"window_reset":`...)
	b = itoa(b, (r.resetMS+999)/1000)
	b = append(b, `,"retry_after":`...)
	b = itoa(b, rules.RetryAfterSeconds(&rules.Decision{RetryAfterMS: r.until - nowMS}, nowMS))
	b = append(b, '}')
	p.event = b
	p.host.Log(proxywasm.LogLevelInfo, b)
	r.pending, r.eventSec = 0, nowMS/1000
}

// reportAllRefusals flushes every pending count, at least a second after
// the key's last event: called once a second.
func (p *Plugin) reportAllRefusals(nowMS int64) {
	for i := range p.refusals {
		if r := &p.refusals[i]; r.pending > 0 && nowMS/1000 > r.eventSec {
			p.reportRefusals(r, nowMS)
		}
	}
}
