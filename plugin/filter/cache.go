package filter

import (
	"encoding/binary"

	"github.com/sluicehq/sluice/rules"
)

// The over-limit cache lets every worker VM answer 429 for a key the bridge
// already refused, without a call-out, until the refusal's retry time.
//
// It lives in proxy shared data, which ABI v0.2.1 cannot delete from, so a
// growing set of keys would grow the proxy's memory without bound. Instead
// the cache has a fixed number of slots (local_cache.max_entries); a key
// hashes to one slot and overwrites what was there. An evicted entry only
// costs one call-out, which the bridge answers the same way.
//
// Slot value: key length (2 bytes), key, then until, limit and reset (Unix
// ms, 8 bytes each, little endian).

const cachePrefix = "sluice.oc."

// keyHash is the FNV-1a hash of a counter key: it picks the key's cache
// slot and its entry in the VM's refusal memo.
func keyHash(key []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

func (p *Plugin) slotKey(h uint64, slots int64) string {
	p.scratch = itoa(append(p.scratch[:0], cachePrefix...), int64(h%uint64(slots)))
	return bytesString(p.scratch)
}

// cachedDenial finds an enforced limit of s that is cached as over limit;
// h is its key's hash.
func (p *Plugin) cachedDenial(s *Stream) (i int, d rules.Decision, h uint64, ok bool) {
	for i := range s.plan.Limits {
		l := &s.plan.Limits[i]
		if l.Action != rules.Reject {
			continue
		}
		h := keyHash(l.Key)
		// This VM refused the key lately: its own copy of the cache entry
		// answers without asking the host for shared data.
		if r := &p.refusals[h%refusalSlots]; r.cfg == s.cfg && r.until > s.nowMS && string(r.key) == string(l.Key) {
			return i, rules.Decision{Limit: r.limit, ResetMS: r.resetMS, RetryAfterMS: r.until - s.nowMS}, h, true
		}
		v := p.host.SharedGet(p.slotKey(h, s.cfg.LocalCache.MaxEntries))
		if len(v) < 2 {
			continue
		}
		n := int(binary.LittleEndian.Uint16(v))
		if len(v) != 2+n+24 || string(v[2:2+n]) != string(l.Key) {
			continue
		}
		v = v[2+n:]
		until := int64(binary.LittleEndian.Uint64(v))
		if until <= s.nowMS {
			continue
		}
		return i, rules.Decision{
			Limit:        int64(binary.LittleEndian.Uint64(v[8:])),
			ResetMS:      int64(binary.LittleEndian.Uint64(v[16:])),
			RetryAfterMS: until - s.nowMS,
		}, h, true
	}
	return 0, rules.Decision{}, 0, false
}

// cacheDenial remembers that key is over its limit until the retry time.
func (p *Plugin) cacheDenial(cfg *rules.Config, key []byte, d *rules.Decision, nowMS int64) {
	if d.RetryAfterMS <= 0 || len(key) > 0xffff {
		return
	}
	v := p.event[:0] // free at this point; reused as the value buffer
	v = binary.LittleEndian.AppendUint16(v, uint16(len(key)))
	v = append(v, key...)
	v = binary.LittleEndian.AppendUint64(v, uint64(nowMS+d.RetryAfterMS))
	v = binary.LittleEndian.AppendUint64(v, uint64(d.Limit))
	v = binary.LittleEndian.AppendUint64(v, uint64(d.ResetMS))
	p.event = v
	p.host.SharedSet(p.slotKey(keyHash(key), cfg.LocalCache.MaxEntries), v)
}
