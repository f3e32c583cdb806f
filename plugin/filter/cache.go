package filter

import (
	"github.com/sluicehq/sluice/rules"
)

// The over-limit cache lets every worker VM answer 429 for a key the bridge
// already refused, without a call-out, until the refusal's retry time.
//
// It lives in proxy shared data, which ABI v0.2.1 cannot delete from, so a
// growing set of keys would grow the proxy's memory without bound. Instead
// the cache has a fixed number of slots (local_cache.max_entries); a key
// hashes to one slot and overwrites what was there. An evicted entry only
// costs one call-out, which the bridge answers the same way. A key's
// leases live in the same slot (lease.go, which lays the value out); a
// lease being spent is never evicted, and one that ended is handed back
// by whoever evicts it.

const cachePrefix = "sluice.oc."

// cachedDenial finds an enforced limit of s that is cached as over limit,
// and answered from the cache until hold; with held, one whose hold
// ended too, until its retry time (the bridge was asked again and did not
// answer). h is its key's hash, and memo tells that the VM's own
// rendering of the refusal (refusals[h%refusalSlots]) is of that key and
// configuration.
func (p *Plugin) cachedDenial(s *Stream, held bool) (i int, d rules.Decision, hold int64, h uint64, memo, ok bool) {
	for i := range s.plan.Limits {
		l := &s.plan.Limits[i]
		if l.Action == rules.LogOnly {
			continue
		}
		h := rules.Hash(l.Key)
		// This VM refused the key lately: its own copy of the cache entry
		// answers without asking the host for shared data.
		r := &p.refusals[h%refusalSlots]
		memo := r.cfg == s.cfg && string(r.key) == string(l.Key)
		if memo && answers(r.hold, r.until, held, s.nowMS) {
			return i, rules.Decision{Limit: r.limit, ResetMS: r.resetMS, RetryAfterMS: r.until - s.nowMS}, r.hold, h, true, true
		}
		v, _ := p.host.SharedGetCAS(p.slotName(h, s.cfg.LocalCache.MaxEntries))
		e := &p.entry
		if !parseSlot(v, e) || string(e.key) != string(l.Key) || !answers(e.hold, e.until, held, s.nowMS) {
			continue
		}
		return i, rules.Decision{Limit: e.limit, ResetMS: e.reset, RetryAfterMS: e.until - s.nowMS}, e.hold, h, memo, true
	}
	return 0, rules.Decision{}, 0, 0, false, false
}

// answers tells whether a cached denial held until hold and retried at
// until answers at now: until hold, or with held until its retry time.
func answers(hold, until int64, held bool, now int64) bool {
	if held {
		return until > now
	}
	return hold > now
}

// cacheDenial remembers that key is over its limit until the retry time,
// to be answered from the cache for local_cache.max_hold at most.
func (p *Plugin) cacheDenial(cfg *rules.Config, key []byte, d *rules.Decision, nowMS int64) {
	if d.RetryAfterMS <= 0 || len(key) > 0xffff {
		return
	}
	local := p.host.NowNanos() / 1e6
	k := p.slotName(rules.Hash(key), cfg.LocalCache.MaxEntries)
	e := &p.entry
	for range casTries {
		v, cas := p.host.SharedGetCAS(k)
		var back [2]rules.LeaseReturn
		found := parseSlot(v, e)
		if found && string(e.key) != string(key) {
			if e.leased && e.held(local) > 0 {
				return // a lease being spent keeps its slot
			}
			back = p.evict(e, local)
			found = false
		}
		if !found {
			*e = slotEntry{key: key}
		}
		e.until, e.limit, e.reset = nowMS+d.RetryAfterMS, d.Limit, d.ResetMS
		e.hold = nowMS + min(d.RetryAfterMS, cfg.LocalCache.MaxHoldMS)
		if p.write(k, e, cas) {
			p.sendEvicted(cfg, back)
			return
		}
	}
}

// evict closes what the leases of e, another key's entry about to be
// replaced, hold though they ended, and keeps its key and spec to hand
// them back once the replacement is written (sendEvicted).
func (p *Plugin) evict(e *slotEntry, now int64) (back [2]rules.LeaseReturn) {
	if !e.leased {
		return back
	}
	back[0], back[1] = e.closeEnded(now), e.closeEnded(now)
	p.evicted = append(p.evicted[:0], e.key...)
	p.evictedSpec = e.spec()
	return back
}

// sendEvicted hands back what evict closed.
func (p *Plugin) sendEvicted(cfg *rules.Config, back [2]rules.LeaseReturn) {
	for _, r := range back {
		if r.Units > 0 {
			p.sendReturn(cfg, p.evicted, &p.evictedSpec, r)
		}
	}
}
