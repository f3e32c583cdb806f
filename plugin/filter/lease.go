package filter

import (
	"encoding/binary"
	"math"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Quota leases (docs/config.md, lease). A limit configured with a lease
// asks the bridge for up to lease.size more units than its request needs;
// the bridge deducts them in the script call that decides the request.
// The proxy keeps them in the key's slot of shared data (the over-limit
// cache's slots, cache.go), where every worker VM spends them with
// compare-and-swap, so that a unit is spent once whichever VM spends it.
//
// A slot holds at most two leases of its key: the one being spent and the
// next, asked for in the background (from the root context, where Envoy
// keeps every call-out) once what the proxy holds falls to half the size,
// one renewal at a time per key (the renewing mark; a key's first lease
// too, the VM that finds its slot free making it the key's). A lease is
// spent only between the moment its request was sent and that moment plus
// its ttl, on this proxy's clock: the bridge counted its units from a later
// moment, so the proxy stops spending them first. Units a lease still
// holds when it ends go back to the bridge exactly once: whoever closes
// the lease in the slot (a compare-and-swap that empties it) sends them,
// on a check it is making for the key or on a call of their own.
//
// Nothing is allocated per request once the buffers have grown; the
// records of call-outs and of leases to hand back are fixed arrays.

// Slot value layout, shared with the over-limit cache. All numbers are
// int64, little endian:
//
//	key length (2 bytes), key
//	denial: until, limit, reset, hold (until 0: none; hold, when the
//	cache stops answering it, at most until)
//	with leases: renewing (when a renewal was asked for, local ms; 0:
//	none), algorithm, limit, window, burst (the spec the leases were
//	granted under, to hand them back), the limit headers show, then two
//	leases of: expires, start (local ms), units left, units granted,
//	tag, remaining and reset (the store's, at the grant)
const (
	denialLen = 4 * 8
	leaseHead = 6 * 8
	subLen    = 7 * 8
	leaseLen  = leaseHead + 2*subLen
)

// casTries bounds the attempts of one change of a slot that other VMs keep
// changing first; the request then asks the bridge.
const casTries = 16

// leaseSub is one lease a slot holds.
type leaseSub struct {
	expires, start      int64 // local ms: spent from start until expires
	units, granted, tag int64
	remaining, reset    int64 // the store's at the grant, for headers
}

// spendable tells whether the lease may be spent at now.
func (l *leaseSub) spendable(now int64) bool {
	return l.units > 0 && l.start <= now && now < l.expires
}

// slotEntry is a slot's value, parsed. key is a view of the value read.
type slotEntry struct {
	key                 []byte
	until, limit, reset int64 // the over-limit cache's denial
	hold                int64 // answered from the cache until then
	leased              bool  // the lease part is present
	renewing            int64
	alg, slimit, window int64
	burst, hlimit       int64
	sub                 [2]leaseSub
}

func get64(b []byte, i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }

// parseSlot reads a slot's value into e; false when it holds none.
func parseSlot(v []byte, e *slotEntry) bool {
	if len(v) < 2 {
		return false
	}
	n := int(binary.LittleEndian.Uint16(v))
	switch len(v) {
	case 2 + n + denialLen:
		e.leased = false
	case 2 + n + denialLen + leaseLen:
		e.leased = true
	default:
		return false
	}
	e.key = v[2 : 2+n]
	r := v[2+n:]
	e.until, e.limit, e.reset, e.hold = get64(r, 0), get64(r, 1), get64(r, 2), get64(r, 3)
	if !e.leased {
		e.sub = [2]leaseSub{}
		e.renewing = 0
		return true
	}
	r = r[denialLen:]
	e.renewing, e.alg, e.slimit, e.window, e.burst, e.hlimit = get64(r, 0), get64(r, 1), get64(r, 2), get64(r, 3), get64(r, 4), get64(r, 5)
	for j := range e.sub {
		s := r[leaseHead+j*subLen:]
		e.sub[j] = leaseSub{expires: get64(s, 0), start: get64(s, 1), units: get64(s, 2), granted: get64(s, 3),
			tag: get64(s, 4), remaining: get64(s, 5), reset: get64(s, 6)}
	}
	return true
}

// appendSlot appends e as a slot's value.
func appendSlot(dst []byte, e *slotEntry) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint16(dst, uint16(len(e.key)))
	dst = append(dst, e.key...)
	for _, n := range [...]int64{e.until, e.limit, e.reset, e.hold} {
		dst = le.AppendUint64(dst, uint64(n))
	}
	if !e.leased {
		return dst
	}
	for _, n := range [...]int64{e.renewing, e.alg, e.slimit, e.window, e.burst, e.hlimit} {
		dst = le.AppendUint64(dst, uint64(n))
	}
	for j := range e.sub {
		s := &e.sub[j]
		for _, n := range [...]int64{s.expires, s.start, s.units, s.granted, s.tag, s.remaining, s.reset} {
			dst = le.AppendUint64(dst, uint64(n))
		}
	}
	return dst
}

// held is what the leases hold that may be spent at now.
func (e *slotEntry) held(now int64) int64 {
	var n int64
	for j := range e.sub {
		if e.sub[j].spendable(now) {
			n += e.sub[j].units
		}
	}
	return n
}

// pick returns the lease to spend cost units from at now: the one that
// expires first among those holding enough; -1 when none does.
func (e *slotEntry) pick(now, cost int64) int {
	best := -1
	for j := range e.sub {
		s := &e.sub[j]
		if s.spendable(now) && s.units >= cost && (best < 0 || s.expires < e.sub[best].expires) {
			best = j
		}
	}
	return best
}

// closeEnded empties a lease that can no longer be spent but holds units
// and returns what to hand back for it (Units 0: none). One at a time: a
// check carries one return per limit.
func (e *slotEntry) closeEnded(now int64) rules.LeaseReturn {
	for j := range e.sub {
		if s := &e.sub[j]; s.units > 0 && !s.spendable(now) {
			r := rules.LeaseReturn{Tag: s.tag, Granted: s.granted, Units: s.units}
			s.units = 0
			return r
		}
	}
	return rules.LeaseReturn{}
}

// find returns the lease granted with tag that began at start; -1 when
// the slot no longer holds it.
func (e *slotEntry) find(tag, start int64) int {
	for j := range e.sub {
		if s := &e.sub[j]; s.tag == tag && s.start == start && s.granted > 0 {
			return j
		}
	}
	return -1
}

// renewingAt tells whether a renewal asked for is still awaited at now.
func (e *slotEntry) renewingAt(now, stale int64) bool {
	return e.renewing != 0 && e.renewing <= now && now-e.renewing < stale
}

// setSpec records the spec a key's leases are granted under.
func (e *slotEntry) setSpec(sp *rules.LimitSpec) {
	e.alg, e.slimit, e.window, e.burst = int64(sp.Algorithm), sp.Limit, sp.WindowMS, sp.Burst
}

// spec is the spec the key's leases were granted under, as a return
// needs it.
func (e *slotEntry) spec() rules.LimitSpec {
	return rules.LimitSpec{Algorithm: rules.Algorithm(e.alg), Limit: e.slimit, WindowMS: e.window, Burst: e.burst, Cost: 1}
}

// staleMS is how long a renewal may be awaited: past it, another VM asks.
func staleMS(cfg *rules.Config) int64 { return 2*int64(cfg.Bridge.TimeoutMS) + 100 }

// slotName is the shared data key of slot h, in a buffer of its own.
func (p *Plugin) slotName(h uint64, slots int64) string {
	p.slotKey = itoa(append(p.slotKey[:0], cachePrefix...), int64(h%uint64(slots)))
	return bytesString(p.slotKey)
}

// createCAS is the token write passes for a slot that was absent when
// read, so that it creates the slot only if it is still absent. With
// token 0 the write would replace whatever another VM created meanwhile
// (a lease, a denial). The host creates an absent key whatever the token,
// and refuses a non-zero token other than an existing key's; tokens count
// up from 1 over every write of the process (proxy-wasm-cpp-host
// src/shared_data.cc SharedData::set, src/shared_data.h nextCas), so a
// slot created between the read and the write holds that moment's token,
// which is this one only for the 2^32-1th write of the process.
const createCAS = math.MaxUint32

// write stores e in slot k if it still holds what cas names (0: nothing).
func (p *Plugin) write(k string, e *slotEntry, cas uint32) bool {
	if cas == 0 {
		cas = createCAS
	}
	p.slotBuf = appendSlot(p.slotBuf[:0], e)
	return p.host.SharedSetCAS(k, p.slotBuf, cas)
}

// streamLease is what a stream did with the lease of one of its limits.
type streamLease struct {
	marked int64 // the renewing mark this stream set (0: none), cleared when no grant comes
	// Spent for a request answered from leases:
	spent      bool
	tag, start int64
	renew      bool              // then renew it in the background,
	ret        rules.LeaseReturn // handing back a lease that ended
	dec        rules.Decision    // what the headers show
}

// leasable tells whether every limit of s is leased: only then can the
// request be answered from leases.
func leasable(limits []rules.PlannedLimit) bool {
	for i := range limits {
		if limits[i].Action != rules.Reject || limits[i].Spec.Lease.Size == 0 {
			return false
		}
	}
	return len(limits) > 0
}

// answerFromLeases spends cost units of every limit of s from the leases
// its proxy holds. When one has none, what was spent goes back and it
// reports false: the bridge decides. Renewals that spending asked for are
// sent either way.
func (s *Stream) answerFromLeases() bool {
	p := s.p
	n := len(s.plan.Limits)
	s.leases = s.leases[:0]
	for range n {
		s.leases = append(s.leases, streamLease{})
	}
	all := true
	for i := range n {
		if !p.spend(s, i) {
			all = false
			break
		}
	}
	for i := range s.leases {
		sl := &s.leases[i]
		if sl.renew {
			p.sendLeaseCall(s.cfg, rules.OpRenew, &s.plan.Limits[i], sl.ret, sl.marked)
			sl.renew = false
		}
		if !all && sl.spent {
			p.unspend(s, i)
		}
	}
	if !all {
		return false
	}
	var units int64
	s.resp.Decisions = s.resp.Decisions[:0]
	for i := range s.leases {
		units += s.plan.Limits[i].Spec.Cost
		s.resp.Decisions = append(s.resp.Decisions, s.leases[i].dec)
	}
	h := p.host
	h.IncCounter(p.m.allowed)
	h.IncCounter(p.m.leaseHits)
	h.AddCounter(p.m.unitsSpent, units)
	if best := rules.Headline(s.plan.Limits, s.resp.Decisions); best >= 0 {
		d := &s.resp.Decisions[best]
		s.cfg.Headers.Render(&s.respHeaders, &s.plan.Limits[best], d, s.nowMS, false)
		if p.debug {
			s.event(proxywasm.LogLevelDebug, "allowed", best, d, "allow")
		}
	}
	s.state = stateDone
	s.answered = true
	return true
}

// spend takes limit i's cost from the leases of its key.
func (p *Plugin) spend(s *Stream, i int) bool {
	l, sl := &s.plan.Limits[i], &s.leases[i]
	now, cost := s.nowMS, l.Spec.Cost
	k := p.slotName(rules.Hash(l.Key), s.cfg.LocalCache.MaxEntries)
	e := &p.entry
	for range casTries {
		v, cas := p.host.SharedGetCAS(k)
		if !parseSlot(v, e) || !e.leased || string(e.key) != string(l.Key) {
			return false
		}
		j := e.pick(now, cost)
		if j < 0 {
			return false
		}
		sub := &e.sub[j]
		sub.units -= cost
		held := e.held(now)
		renew, ret := false, rules.LeaseReturn{}
		if held <= l.Spec.Lease.Size/2 && !e.renewingAt(now, staleMS(s.cfg)) {
			e.renewing, renew = now, true
			ret = e.closeEnded(now)
		}
		dec := rules.Decision{Allowed: true, Limit: e.hlimit, Remaining: sub.remaining + held, ResetMS: sub.reset}
		tag, start := sub.tag, sub.start
		if p.write(k, e, cas) {
			*sl = streamLease{spent: true, tag: tag, start: start, renew: renew, ret: ret, dec: dec}
			if renew {
				sl.marked = now
			}
			return true
		}
	}
	return false
}

// unspend gives limit i's cost back to the lease it was spent from, when
// the request is not answered from leases after all.
func (p *Plugin) unspend(s *Stream, i int) {
	l, sl := &s.plan.Limits[i], &s.leases[i]
	sl.spent = false
	k := p.slotName(rules.Hash(l.Key), s.cfg.LocalCache.MaxEntries)
	e := &p.entry
	for range casTries {
		v, cas := p.host.SharedGetCAS(k)
		if !parseSlot(v, e) || !e.leased || string(e.key) != string(l.Key) {
			break
		}
		j := e.find(sl.tag, sl.start)
		if j < 0 {
			break // the lease ended meanwhile: its units were handed back without these
		}
		e.sub[j].units += l.Spec.Cost
		if p.write(k, e, cas) {
			return
		}
	}
	p.host.AddCounter(p.m.unitsUnreturned, l.Spec.Cost)
}

// prepareLeases readies the limits of a check whose limits are all leased
// (others never ask: their requests are never answered from leases): each
// asks for a lease when its key holds half a lease or less and no renewal
// of it is awaited, and hands back a lease of its key that ended with
// units.
func (s *Stream) prepareLeases() {
	p := s.p
	s.leases = s.leases[:0]
	if !leasable(s.plan.Limits) {
		return
	}
	for i := range s.plan.Limits {
		s.leases = append(s.leases, streamLease{})
		l := &s.plan.Limits[i]
		now := s.nowMS
		k := p.slotName(rules.Hash(l.Key), s.cfg.LocalCache.MaxEntries)
		e := &p.entry
		for range casTries {
			v, cas := p.host.SharedGetCAS(k)
			if !parseSlot(v, e) || string(e.key) != string(l.Key) {
				if cas != 0 {
					l.AskLease = true // another key's slot: it keeps it, so no mark to set
					break
				}
				// A free slot is made the key's, with the mark, so that
				// the other VMs wait for this grant rather than ask too.
				*e = slotEntry{key: l.Key}
			}
			if !e.leased {
				e.leased, e.sub, e.hlimit = true, [2]leaseSub{}, 0
				e.setSpec(l.Spec)
			}
			ret := e.closeEnded(now)
			ask := e.held(now) <= l.Spec.Lease.Size/2 && !e.renewingAt(now, staleMS(s.cfg))
			if ask {
				e.renewing = now
			}
			if (ask || ret.Units > 0) && !p.write(k, e, cas) {
				continue
			}
			l.AskLease, l.Return = ask, ret
			if ask {
				s.leases[i].marked = now
			}
			break
		}
	}
}

// settleLeases acts on the bridge's answer to a check that prepareLeases
// readied (ok: the answer is a decision, in s.resp): grants are installed,
// marks no grant answered are cleared, and returns are counted.
func (s *Stream) settleLeases(ok bool) {
	p := s.p
	for i := range s.leases {
		l := &s.plan.Limits[i]
		if n := l.Return.Units; n > 0 {
			if ok {
				p.host.AddCounter(p.m.unitsReturned, n)
			} else {
				p.host.AddCounter(p.m.unitsUnreturned, n) // it may or may not have been applied: never sent again
			}
		}
		granted := ok && s.resp.Decisions[i].Lease.Units > 0
		if granted {
			p.install(s.cfg, l.Key, l.Spec, &s.resp.Decisions[i], s.nowMS)
		} else if m := s.leases[i].marked; m != 0 {
			p.unmark(s.cfg, l.Key, m)
		}
	}
	s.leases = s.leases[:0]
}

// unmark clears the renewing mark m of key, when it is still there.
func (p *Plugin) unmark(cfg *rules.Config, key []byte, m int64) {
	k := p.slotName(rules.Hash(key), cfg.LocalCache.MaxEntries)
	e := &p.entry
	for range casTries {
		v, cas := p.host.SharedGetCAS(k)
		if !parseSlot(v, e) || !e.leased || string(e.key) != string(key) || e.renewing != m {
			return
		}
		e.renewing = 0
		if p.write(k, e, cas) {
			return
		}
	}
}

// install keeps a grant of key in its slot, sent at sentAt (local ms): a
// free lease of the slot takes it, or one that ended (its units are handed
// back). A slot of another key with a lease still spendable keeps it, and
// the grant goes back at once.
func (p *Plugin) install(cfg *rules.Config, key []byte, sp *rules.LimitSpec, d *rules.Decision, sentAt int64) {
	g := d.Lease
	now := p.host.NowNanos() / 1e6
	sub := leaseSub{expires: sentAt + g.TTLMS, start: sentAt, units: g.Units, granted: g.Units, tag: g.Tag,
		remaining: d.Remaining, reset: d.ResetMS}
	h := rules.Hash(key)
	k := p.slotName(h, cfg.LocalCache.MaxEntries)
	e := &p.entry
	p.host.IncCounter(p.m.leaseGrants)
	p.host.AddCounter(p.m.unitsGranted, g.Units)
	for range casTries {
		v, cas := p.host.SharedGetCAS(k)
		found := parseSlot(v, e)
		// What the change closes, handed back once the change is written.
		var back, ended [2]rules.LeaseReturn
		if found && string(e.key) != string(key) {
			if e.leased && e.held(now) > 0 {
				break // another key's lease is being spent: keep it
			}
			back = p.evict(e, now)
			found = false
		}
		if !found {
			*e = slotEntry{key: key}
		}
		if !e.leased {
			e.leased, e.sub = true, [2]leaseSub{}
		}
		j := -1
		for x := range e.sub {
			if e.sub[x].units == 0 {
				j = x
				break
			}
		}
		if j < 0 {
			for x := range e.sub {
				if !e.sub[x].spendable(now) {
					j = x
					ended[0] = rules.LeaseReturn{Tag: e.sub[x].tag, Granted: e.sub[x].granted, Units: e.sub[x].units}
					break
				}
			}
		}
		if j < 0 {
			break // two leases being spent: this one goes back
		}
		e.renewing = 0
		e.setSpec(sp)
		e.hlimit = d.Limit
		e.sub[j] = sub
		if !p.write(k, e, cas) {
			continue
		}
		p.sendEvicted(cfg, back)
		if ended[0].Units > 0 {
			p.sendReturn(cfg, key, sp, ended[0])
		}
		p.track(h, cfg.LocalCache.MaxEntries, key, &sub)
		return
	}
	p.sendReturn(cfg, key, sp, rules.LeaseReturn{Tag: g.Tag, Granted: g.Units, Units: g.Units})
}

// trackedLease is a lease this VM installed: the tick hands back what it
// holds when it ends unspent.
type trackedLease struct {
	used             bool
	hash             uint64
	slots            int64
	key              []byte
	tag, start, ends int64
}

// trackedSlots bounds the leases a VM watches; a lease it forgets is
// handed back by whoever next installs a lease in its place, or its units
// come back when the store's window or generation ends.
const trackedSlots = 64

func (p *Plugin) track(h uint64, slots int64, key []byte, sub *leaseSub) {
	t := &p.tracked[p.trackNext]
	p.trackNext = (p.trackNext + 1) % trackedSlots
	t.used, t.hash, t.slots = true, h, slots
	t.key = append(t.key[:0], key...)
	t.tag, t.start, t.ends = sub.tag, sub.start, sub.expires
}

// leaseTick hands back what the leases this VM installed still hold once
// they end.
func (p *Plugin) leaseTick(now int64) {
	if p.cfg == nil {
		return
	}
	e := &p.entry
	for i := range p.tracked {
		t := &p.tracked[i]
		if !t.used || now < t.ends {
			continue
		}
		t.used = false
		k := p.slotName(t.hash, t.slots)
		for range casTries {
			v, cas := p.host.SharedGetCAS(k)
			if !parseSlot(v, e) || !e.leased || string(e.key) != string(t.key) {
				break
			}
			j := e.find(t.tag, t.start)
			if j < 0 || e.sub[j].units == 0 || e.sub[j].spendable(now) {
				break // spent, or handed back already
			}
			r := rules.LeaseReturn{Tag: e.sub[j].tag, Granted: e.sub[j].granted, Units: e.sub[j].units}
			e.sub[j].units = 0
			if p.write(k, e, cas) {
				p.evictedSpec = e.spec()
				p.sendReturn(p.cfg, t.key, &p.evictedSpec, r)
				break
			}
		}
	}
}

// leaseCall is a renewal or a return in flight.
type leaseCall struct {
	used   bool
	id     uint32
	op     rules.Op
	cfg    *rules.Config
	key    []byte
	spec   rules.LimitSpec
	sentAt int64
	mark   int64             // a renewal's renewing mark
	ret    rules.LeaseReturn // units handed back with it
}

// leaseCallSlots bounds the renewals and returns a VM has in flight.
const leaseCallSlots = 64

// sendReturn hands r back for key (spec: how its limit counts).
func (p *Plugin) sendReturn(cfg *rules.Config, key []byte, spec *rules.LimitSpec, r rules.LeaseReturn) {
	l := rules.PlannedLimit{Key: key, Spec: spec, Action: rules.Reject}
	p.sendLeaseCall(cfg, rules.OpReturn, &l, r, 0)
}

// sendLeaseCall sends a renewal (with its mark) or a return of limit l,
// handing back r with it. What cannot be sent is counted, and its mark
// cleared.
func (p *Plugin) sendLeaseCall(cfg *rules.Config, op rules.Op, l *rules.PlannedLimit, r rules.LeaseReturn, mark int64) {
	var c *leaseCall
	for i := range p.leaseCalls {
		if !p.leaseCalls[i].used {
			c = &p.leaseCalls[i]
			break
		}
	}
	if c != nil {
		c.key = append(c.key[:0], l.Key...)
		c.spec = *l.Spec
		c.spec.Penalty = nil
		lim := rules.PlannedLimit{Key: c.key, Rule: l.Rule, Spec: &c.spec, Action: rules.Reject, AskLease: op == rules.OpRenew, Return: r}
		p.leaseBody = rules.AppendLeaseCall(p.leaseBody[:0], op, "", &lim)
		b := &cfg.Bridge
		p.leaseHdrs = p.appendCallHeaders(p.leaseHdrs[:0], b, "")
		id, err := p.host.Dispatch(b.Cluster, p.leaseHdrs, p.leaseBody, b.TimeoutMS)
		if err == nil {
			*c = leaseCall{used: true, id: id, op: op, cfg: cfg, key: c.key, spec: c.spec,
				sentAt: p.host.NowNanos() / 1e6, mark: mark, ret: r}
			p.leaseInFlight++
			if op == rules.OpRenew {
				p.host.IncCounter(p.m.leaseRenewals)
			}
			return
		}
	}
	if r.Units > 0 {
		p.host.AddCounter(p.m.unitsUnreturned, r.Units)
	}
	if mark != 0 {
		p.unmark(cfg, l.Key, mark)
	}
}

// leaseCallResponse handles the answer to a renewal or a return; false
// when calloutID is not one.
func (p *Plugin) leaseCallResponse(calloutID uint32, numHeaders, bodySize int) bool {
	if p.leaseInFlight == 0 {
		return false
	}
	var c *leaseCall
	for i := range p.leaseCalls {
		if p.leaseCalls[i].used && p.leaseCalls[i].id == calloutID {
			c = &p.leaseCalls[i]
			break
		}
	}
	if c == nil {
		return false
	}
	p.settleLeaseCall(c, numHeaders, bodySize)
	// Released only now: what it holds was in use until then.
	c.used = false
	p.leaseInFlight--
	return true
}

func (p *Plugin) settleLeaseCall(c *leaseCall, numHeaders, bodySize int) {
	ok := false
	if numHeaders > 0 {
		status, body := p.host.CallResponse(bodySize)
		ok = status == "200" && rules.DecodeCheckResponse(body, 1, &p.leaseResp) == nil
	}
	if n := c.ret.Units; n > 0 {
		if ok {
			p.host.AddCounter(p.m.unitsReturned, n)
		} else {
			p.host.AddCounter(p.m.unitsUnreturned, n)
		}
	}
	if c.op != rules.OpRenew {
		return
	}
	if ok && p.leaseResp.Decisions[0].Lease.Units > 0 {
		p.install(c.cfg, c.key, &c.spec, &p.leaseResp.Decisions[0], c.sentAt)
	} else if c.mark != 0 {
		p.unmark(c.cfg, c.key, c.mark)
	}
}
