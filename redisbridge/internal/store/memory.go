package store

import (
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// Memory keeps counters in this process, for a single bridge. It runs the
// same algorithms as check.lua with the same floating point operations in
// the same order, so both stores round alike.
type Memory struct {
	now      func() int64
	seed     maphash.Seed
	shards   [memShards]memShard
	maxShard int
}

const memShards = 64

type memShard struct {
	mu sync.Mutex
	m  map[string]*entry
}

// entry is one key. Which fields are used depends on the key's suffix.
type entry struct {
	expireAt int64 // unix ms; the entry is gone from then on
	tokens   float64
	ts       int64 // token bucket: last refill
	gens     leaseGens
	w, c, p  int64   // windows: index, count, previous count
	log      []int64 // sliding log and violations: ms times, ascending
	// leased counts a sliding log's lease members by their score (check.lua
	// names them apart: a return removes only those).
	leased map[int64]int64
	until  int64 // block-until
}

// leaseGens are a token bucket's two generations of leases (check.lua's
// la, lae, ag and lb, lbe, bg): units held, expiry, tag.
type leaseGens struct {
	la, lae, ag int64
	lb, lbe, bg int64
}

// held is what the generations alive at t hold.
func (g *leaseGens) held(t int64) int64 {
	var n int64
	if t < g.lae {
		n = g.la
	}
	if t < g.lbe {
		n += g.lb
	}
	return n
}

// MemoryOptions configure a Memory store.
type MemoryOptions struct {
	MaxKeys int          // bound on stored keys, default 1,000,000
	Now     func() int64 // clock in unix ms, default time.Now
}

// NewMemory returns an empty memory store.
func NewMemory(o MemoryOptions) *Memory {
	if o.MaxKeys <= 0 {
		o.MaxKeys = 1_000_000
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixMilli() }
	}
	s := &Memory{now: o.Now, seed: maphash.MakeSeed(), maxShard: max(1, o.MaxKeys/memShards)}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

func (s *Memory) shard(key string) int {
	return int(maphash.String(s.seed, key) % memShards)
}

// get returns the live entry for key or nil. The shard must be locked.
func (s *Memory) get(key string, now int64) *entry {
	sh := &s.shards[s.shard(key)]
	e := sh.m[key]
	if e != nil && e.expireAt <= now {
		delete(sh.m, key)
		return nil
	}
	return e
}

// put returns the entry for key, creating it (and evicting when the shard
// is full) if needed. The shard must be locked.
func (s *Memory) put(key string, now int64) *entry {
	sh := &s.shards[s.shard(key)]
	if e := sh.m[key]; e != nil {
		if e.expireAt <= now {
			*e = entry{log: e.log[:0]}
		}
		return e
	}
	if len(sh.m) >= s.maxShard {
		s.evict(sh, now)
	}
	e := &entry{}
	sh.m[key] = e
	return e
}

// evict drops expired entries among a sample, or else the sampled entry
// closest to expiry, in the manner of Redis's approximated eviction.
func (s *Memory) evict(sh *memShard, now int64) {
	victim, soonest, n := "", int64(math.MaxInt64), 0
	for k, e := range sh.m {
		if e.expireAt <= now {
			delete(sh.m, k)
			victim = ""
			soonest = math.MinInt64
		} else if e.expireAt < soonest {
			victim, soonest = k, e.expireAt
		}
		if n++; n >= 16 {
			break
		}
	}
	if victim != "" {
		delete(sh.m, victim)
	}
}

// lock locks the shards of keys in ascending order (no deadlock between
// checks that share shards) and returns them for unlock.
func (s *Memory) lock(keys []string, buf []int) []int {
	for _, k := range keys {
		buf = append(buf, s.shard(k))
	}
	slices.Sort(buf)
	buf = slices.Compact(buf)
	for _, i := range buf {
		s.shards[i].mu.Lock()
	}
	return buf
}

func (s *Memory) unlock(idx []int) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// memLimit is one limit while a check is being decided.
type memLimit struct {
	spec             rules.LimitSpec // Cost: a fill limit's as decided (fillCost)
	logOnly, fill    bool
	quota            bool // rules.LimitRequest.InQuota
	key, vkey, bkey  string
	ok, blocked      bool
	cap              int64
	remaining, reset int64
	retry            int64
	// state to write when the request is allowed
	tokens  float64
	gens    leaseGens
	w, c, p int64
	count   int64
	ttl     int64
	ret     rules.LeaseReturn // handed back before the check is decided
	grant   rules.LeaseGrant  // granted with it
	unique  bool              // its key is listed once in the check
	// A throttle limit: how long it may hold the request, the earliest
	// time it can take it, and what reserve needs (check.lua's slotOf).
	throttle bool
	maxDelay int64
	slot     int64
	top      int64 // sliding log: the latest member's score
}

// checkScratch is what a check is worked out in, kept for the next one
// (BenchmarkMemory_Check).
type checkScratch struct {
	ls   []memLimit
	keys []string
}

var checkScratches = sync.Pool{New: func() any { return new(checkScratch) }}

// Check implements Store.
func (s *Memory) Check(_ context.Context, _ time.Time, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	sc := checkScratches.Get().(*checkScratch)
	defer func() {
		clear(sc.ls) // nothing of this check stays reachable from the pool
		clear(sc.keys)
		checkScratches.Put(sc)
	}()
	sc.ls = slices.Grow(sc.ls[:0], len(req.Limits))[:len(req.Limits)]
	sc.keys = slices.Grow(sc.keys[:0], 3*len(req.Limits))
	ls, keys := sc.ls, sc.keys
	consume := req.Op != rules.OpReturn
	for i := range req.Limits {
		l := &req.Limits[i]
		m := &ls[i]
		m.spec, m.logOnly, m.fill, m.ret, m.maxDelay = l.Spec, l.LogOnly, l.Fill, l.Return, l.MaxDelay()
		m.quota = l.InQuota()
		m.spec.Lease = leaseOf(l)
		m.throttle = m.maxDelay >= 0
		if req.Op == rules.OpRenew {
			m.spec.Cost = 0
		}
		m.key = l.Key + keySuffix(&l.Spec)
		keys = append(keys, m.key)
		if p := l.Spec.Penalty; p != nil && p.Enabled {
			m.vkey, m.bkey = l.Key+suffixViolations, l.Key+suffixBlock
			keys = append(keys, m.vkey, m.bkey)
		}
	}
	sc.keys = keys
	var buf [16]int
	locked := s.lock(keys, buf[:0])
	defer s.unlock(locked)
	now := s.now()
	resp.NowMS = now
	for i := range ls {
		m := &ls[i]
		m.unique = true
		for j := range ls {
			if j != i && ls[j].key == m.key {
				m.unique = false
			}
		}
		if m.ret.Units > 0 {
			s.giveBack(m, now)
		}
	}
	resp.Allowed, resp.DelayMS = s.decide(ls, now, consume)
	resp.Decisions = resp.Decisions[:0]
	for i := range ls {
		m := &ls[i]
		resp.Decisions = append(resp.Decisions, rules.Decision{
			Allowed: m.ok, Limit: m.cap, Remaining: m.remaining, ResetMS: m.reset, RetryAfterMS: m.retry, Lease: m.grant,
		})
	}
	return nil
}

// decide is check.lua's main part: the throttle limits at the latest of
// their slots, the others at now. It returns whether the check is allowed
// and, when it is, its delay. The shards of all keys must be locked.
func (s *Memory) decide(ls []memLimit, now int64, consume bool) (bool, int64) {
	allowed, at := true, now
	for i := range ls {
		m := &ls[i]
		switch {
		case m.throttle:
			s.slotOf(m, now)
		case m.spec.Algorithm == rules.TokenBucket:
			s.tokenBucket(m, now)
		case m.spec.Algorithm == rules.SlidingWindow:
			s.slidingWindow(m, now)
		case m.spec.Algorithm == rules.SlidingLog:
			s.slidingLog(m, now)
		default:
			s.fixedWindow(m, now)
		}
		if m.bkey != "" {
			if b := s.get(m.bkey, now); b != nil && b.until > now {
				m.ok, m.blocked, m.remaining, m.retry, m.reset = false, true, 0, b.until-now, max(m.reset, b.until)
			}
		}
		if m.throttle && m.ok {
			at = max(at, m.slot)
		}
	}
	quotas, quotaOK := false, false
	for i := range ls {
		m := &ls[i]
		if m.throttle && m.ok && at-now > m.maxDelay {
			m.ok, m.retry = false, at-now-m.maxDelay
		}
		switch {
		case m.quota:
			quotas = true
			quotaOK = quotaOK || m.ok
		case !m.ok && !m.logOnly:
			allowed = false
		}
	}
	if quotas && !quotaOK {
		allowed = false
	}
	delay := int64(0)
	if allowed {
		delay = at - now
	}
	if !consume {
		return allowed, delay
	}
	for i := range ls {
		m := &ls[i]
		if allowed {
			switch {
			case m.throttle:
				s.reserve(m, now, at)
			case m.ok:
				// A key listed twice is written once per listing, the last
				// holding: never leased (check.lua, checkMany).
				if m.spec.Lease.Size > 0 && !m.logOnly && m.vkey == "" && (m.unique || len(ls) == 1) {
					s.lease(m, now)
				}
				s.write(m, now)
			}
		} else if !m.ok && !m.logOnly && m.vkey != "" && !m.blocked {
			s.violate(m, now)
		}
	}
	return allowed, delay
}

func ceilInt(f float64) int64  { return int64(math.Ceil(f)) }
func floorInt(f float64) int64 { return int64(math.Floor(f)) }

// tbNow is a token bucket's tokens at now and its lease generations alive
// at now (check.lua's tbNow: the refill stops at the burst minus what live
// leases hold, segment by segment between their expiries).
func tbNow(e *entry, spec *rules.LimitSpec, now int64) (float64, leaseGens) {
	capa, limit, w := float64(spec.Burst), float64(spec.Limit), float64(spec.WindowMS)
	if e == nil {
		return capa, leaseGens{}
	}
	g := e.gens
	tokens, t := e.tokens, e.ts
	d1, d2 := g.lae, g.lbe
	if d2 < d1 {
		d1, d2 = d2, d1
	}
	if d1 > t && d1 < now {
		tokens = min(max(0, capa-float64(g.held(t))), tokens+float64(d1-t)*limit/w)
		t = d1
	}
	if d2 > t && d2 < now {
		tokens = min(max(0, capa-float64(g.held(t))), tokens+float64(d2-t)*limit/w)
		t = d2
	}
	tokens = min(max(0, capa-float64(g.held(t))), tokens+float64(max(0, now-t))*limit/w)
	if g.lae <= now {
		g.la = 0
	}
	if g.lbe <= now {
		g.lb = 0
	}
	return tokens, g
}

// fillCost sets a fill limit's cost from the room it has left
// (check.lua's fillCost).
func (m *memLimit) fillCost(room int64) {
	if room < 1 {
		m.spec.Cost = 1
	} else {
		m.spec.Cost = min(m.spec.Cost, room)
	}
}

func (s *Memory) tokenBucket(m *memLimit, now int64) {
	tokens, gens := tbNow(s.get(m.key, now), &m.spec, now)
	if m.fill {
		m.fillCost(floorInt(tokens))
	}
	capa, limit, w, cost := float64(m.spec.Burst), float64(m.spec.Limit), float64(m.spec.WindowMS), float64(m.spec.Cost)
	m.cap = m.spec.Burst
	m.gens = gens
	m.ok = tokens >= cost
	after := tokens
	if m.ok {
		after = tokens - cost
	}
	m.remaining = max(0, floorInt(after))
	if m.fill {
		m.remaining = max(0, floorInt(tokens))
	}
	m.reset = now + ceilInt((capa-after)*w/limit)
	if !m.ok {
		if cost > capa {
			m.retry = m.spec.WindowMS
		} else {
			m.retry = ceilInt((cost - tokens) * w / limit)
		}
	}
	m.tokens = after
}

func (s *Memory) slidingWindow(m *memLimit, now int64) {
	limit, W := m.spec.Limit, m.spec.WindowMS
	m.cap = limit
	idx := now / W
	var cur, prev int64
	if e := s.get(m.key, now); e != nil {
		if e.w == idx {
			cur, prev = e.c, e.p
		} else if e.w == idx-1 {
			prev = e.c
		}
	}
	elapsed := now - idx*W
	// The explicit conversion keeps the compiler from fusing multiply and
	// add, which Lua does not do.
	est := float64(float64(prev)*(float64(W-elapsed)/float64(W))) + float64(cur)
	rem := float64(limit) - est
	if m.fill {
		m.fillCost(floorInt(rem))
	}
	cost := m.spec.Cost
	m.ok = est+float64(cost) <= float64(limit)
	after := cur
	if m.ok {
		after = cur + cost
		if !m.fill {
			rem -= float64(cost)
		}
	}
	m.remaining = max(0, floorInt(rem))
	switch {
	case after > 0:
		m.reset = (idx + 2) * W
	case prev > 0:
		m.reset = (idx + 1) * W
	default:
		m.reset = now
	}
	if !m.ok {
		if cost > limit {
			m.retry = W
		} else {
			if room := limit - cost - cur; room >= 0 {
				m.retry = ceilInt(float64(W) - float64(room)*float64(W)/float64(prev) - float64(elapsed))
			} else {
				m.retry = (idx+1)*W - now + ceilInt(float64(W)-float64(limit-cost)*float64(W)/float64(cur))
			}
			m.retry = max(1, m.retry)
		}
	}
	m.w, m.c, m.p = idx, after, prev
	m.ttl = 2*W + 1000
}

func (s *Memory) slidingLog(m *memLimit, now int64) {
	limit, W := m.spec.Limit, m.spec.WindowMS
	m.cap = limit
	var inWindow []int64
	if e := s.get(m.key, now); e != nil {
		from, _ := slices.BinarySearch(e.log, now-W+1)
		inWindow = e.log[from:]
	}
	count := int64(len(inWindow))
	if m.fill {
		m.fillCost(limit - count)
	}
	cost := m.spec.Cost
	m.ok = count+cost <= limit
	after := count
	if m.ok {
		after = count + cost
	}
	m.remaining = limit - after
	if m.fill {
		m.remaining = max(0, limit-count)
	}
	switch {
	case after == 0:
		m.reset = now
	case m.ok && cost > 0:
		m.reset = now + W
	default:
		m.reset = inWindow[len(inWindow)-1] + W
	}
	if !m.ok {
		if cost > limit {
			m.retry = W
		} else {
			m.retry = max(1, inWindow[count+cost-limit-1]+W-now)
		}
	}
	m.count = count
	m.ttl = W
}

func (s *Memory) fixedWindow(m *memLimit, now int64) {
	limit, W := m.spec.Limit, m.spec.WindowMS
	m.cap = limit
	idx := m.spec.FixedWindowIndex(now)
	end := m.spec.FixedWindowStart(idx + 1)
	cur := fwCount(s.get(m.key, now), idx, limit, false)
	if m.fill {
		m.fillCost(limit - cur)
	}
	cost := m.spec.Cost
	m.ok = cur+cost <= limit
	after := cur
	if m.ok {
		after = cur + cost
	}
	m.remaining = max(0, limit-after)
	if m.fill {
		m.remaining = max(0, limit-cur)
	}
	if after > 0 {
		m.reset = end
	} else {
		m.reset = now
	}
	if !m.ok {
		if cost > limit {
			m.retry = W
		} else {
			m.retry = end - now
		}
	}
	m.w, m.c = idx, after
	m.ttl = end - now + 1000
}

// fwCount is a fixed window's count in window idx (check.lua's fwCount):
// the units counted from the stored window on; with carry (a throttle
// limit's), less the windows that ended since, of limit units each, and
// without, none once its window ended.
func fwCount(e *entry, idx, limit int64, carry bool) int64 {
	switch {
	case e == nil:
		return 0
	case e.w >= idx:
		return e.c
	case !carry:
		return 0
	}
	return max(0, e.c-(idx-e.w)*limit)
}

// slotOf finds when a throttle limit can take its request (check.lua's
// slotOf): m.slot, with ok false when it never can, and the limit's
// remaining and reset as it stands.
func (s *Memory) slotOf(m *memLimit, now int64) {
	limit, W, cost := m.spec.Limit, m.spec.WindowMS, m.spec.Cost
	capa := limit
	e := s.get(m.key, now)
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		capa = m.spec.Burst
		fl, fw, fc := float64(limit), float64(W), float64(capa)
		tokens, gens := tbNow(e, &m.spec, now)
		m.tokens, m.gens = tokens, gens
		m.slot = now
		if tokens < float64(cost) {
			m.slot = now + ceilInt(float64((float64(cost)-tokens)*fw)/fl)
		}
		m.remaining, m.reset = max(0, floorInt(tokens)), now+ceilInt(float64((fc-tokens)*fw)/fl)
	case rules.FixedWindow:
		idx := now / W
		cur := fwCount(e, idx, limit, true)
		j := cur / limit
		if cur-j*limit+cost > limit {
			j++
		}
		m.slot = now
		if j > 0 {
			m.slot = (idx + j) * W
		}
		m.remaining, m.reset = max(0, limit-cur), now
		if cur > 0 {
			m.reset = (idx + (cur-1)/limit + 1) * W
		}
		m.c = cur
	default: // sliding log
		var log []int64
		if e != nil {
			log = e.log
		}
		from, _ := slices.BinarySearch(log, now-W+1)
		m.count = int64(len(log) - from)
		m.top = now
		if n := len(log); n > 0 {
			m.top = log[n-1]
		}
		m.slot = max(now, m.top)
		// The window ending at the slot may hold limit - cost members: the
		// one before them, counted from the top, must have left it.
		if k := int64(len(log)) - (limit - cost + 1); k >= 0 && limit-cost+1 > 0 {
			m.slot = max(m.slot, log[k]+W)
		}
		m.remaining, m.reset = max(0, limit-m.count), now
		if m.count > 0 {
			m.reset = m.top + W
		}
	}
	m.cap = capa
	m.ok = cost <= capa
	if !m.ok {
		m.retry = W
	}
}

// reserve writes what a throttle limit takes for a request passing at at,
// its slot or later (check.lua's reserve).
func (s *Memory) reserve(m *memLimit, now, at int64) {
	limit, W, cost := m.spec.Limit, m.spec.WindowMS, m.spec.Cost
	e := s.put(m.key, now)
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		fl, fw, fc := float64(limit), float64(W), float64(m.spec.Burst)
		// Taken at at: the tokens then, capped, less cost, as tokens at now.
		after := m.tokens - float64(cost) - max(0, m.tokens+float64(float64(at-now)*fl)/fw-fc)
		e.tokens, e.ts, e.gens = after, now, m.gens
		e.expireAt = now + tbTTL(&m.spec, &m.gens, now, after)
		m.remaining, m.reset = max(0, floorInt(after)), now+ceilInt(float64((fc-after)*fw)/fl)
	case rules.FixedWindow:
		idx := now / W
		c := max(m.c, (at/W-idx)*limit) + cost
		last, reset := idx, now
		if c > 0 {
			last = idx + (c-1)/limit
			reset = (last + 1) * W
		}
		e.w, e.c = idx, c
		e.expireAt = (last+1)*W + 1000
		m.remaining, m.reset = max(0, limit-c), reset
	default: // sliding log
		from, _ := slices.BinarySearch(e.log, now-W+1)
		e.log = append(e.log[:0], e.log[from:]...)
		for score := range e.leased {
			if score <= now-W {
				delete(e.leased, score)
			}
		}
		e.log = insertTimes(e.log, at, cost)
		top := max(m.top, at)
		e.expireAt = top + W
		if len(e.log) == 0 {
			e.expireAt = now // Redis deletes an empty ZSET (a renewal adds none)
		}
		m.remaining, m.reset = 0, top+W
		if at == now {
			m.remaining = max(0, limit-m.count-cost)
		}
	}
}

// lease grants an allowed limit a lease of up to its lease size of what
// its check left (check.lua's lease).
func (s *Memory) lease(m *memLimit, now int64) {
	size, ttl, limit, W := m.spec.Lease.Size, m.spec.Lease.TTLMS, m.spec.Limit, m.spec.WindowMS
	var n int64
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		n = min(size, floorInt(m.tokens))
	case rules.SlidingWindow:
		n = min(size, m.remaining)
	case rules.SlidingLog:
		n = min(size, limit-(m.count+m.spec.Cost))
	default:
		n = min(size, limit-m.c)
	}
	if n < max(1, m.spec.Cost) {
		return
	}
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		g := &m.gens
		if g.la > 0 && g.lb == 0 {
			g.lb, g.lbe, g.bg, g.la, g.lae = g.la, g.lae, g.ag, 0, 0
		}
		if g.la == 0 {
			g.ag, g.lae = max(now, g.ag+1, g.bg+1), 0
		}
		g.la, g.lae = g.la+n, max(g.lae, now+2*ttl) // held twice the ttl, as check.lua does
		m.tokens -= float64(n)
		m.remaining = floorInt(m.tokens)
		m.reset = now + ceilInt((float64(m.spec.Burst)-m.tokens)*float64(W)/float64(limit))
		m.grant = rules.LeaseGrant{Units: n, TTLMS: ttl, Tag: g.ag}
	case rules.SlidingLog:
		m.remaining -= n
		m.reset = max(m.reset, now+ttl+W)
		m.grant = rules.LeaseGrant{Units: n, TTLMS: ttl, Tag: now + ttl}
	default:
		m.c += n
		m.remaining -= n
		m.grant = rules.LeaseGrant{Units: n, TTLMS: min(ttl, (m.w+1)*W-now), Tag: m.w}
	}
}

// tbTTL is how long a token bucket's key lives: until it refilled from
// tokens (or from empty, when there are more), and past the expiry of its
// live leases.
func tbTTL(spec *rules.LimitSpec, g *leaseGens, now int64, tokens float64) int64 {
	ttl := ceilInt(float64((float64(spec.Burst)-min(0, tokens))*float64(spec.WindowMS))/float64(spec.Limit)) + 1000
	if g.la > 0 {
		ttl = max(ttl, g.lae-now+1000)
	}
	if g.lb > 0 {
		ttl = max(ttl, g.lbe-now+1000)
	}
	return ttl
}

// write stores the state decided for an admitted limit, with its lease.
func (s *Memory) write(m *memLimit, now int64) {
	e := s.put(m.key, now)
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		e.tokens, e.ts, e.gens = m.tokens, now, m.gens
		m.ttl = tbTTL(&m.spec, &m.gens, now, m.tokens)
	case rules.SlidingWindow:
		e.w, e.c, e.p = m.w, m.c, m.p
	case rules.SlidingLog:
		cut := now - m.spec.WindowMS
		from, _ := slices.BinarySearch(e.log, cut+1)
		e.log = append(e.log[:0], e.log[from:]...)
		for score := range e.leased {
			if score <= cut {
				delete(e.leased, score)
			}
		}
		e.log = insertTimes(e.log, now, m.spec.Cost)
		if g := m.grant; g.Units > 0 {
			e.log = insertTimes(e.log, g.Tag, g.Units)
			if e.leased == nil {
				e.leased = map[int64]int64{}
			}
			e.leased[g.Tag] += g.Units
		}
		m.ttl = m.spec.WindowMS
		if n := len(e.log); n > 0 {
			m.ttl = max(m.ttl, e.log[n-1]+m.spec.WindowMS-now)
		} else {
			m.ttl = 0 // Redis deletes an empty ZSET (a renewal adds none)
		}
	default:
		e.w, e.c = m.w, m.c
	}
	e.expireAt = now + m.ttl
}

// insertTimes adds n times t to an ascending log.
func insertTimes(log []int64, t, n int64) []int64 {
	at, _ := slices.BinarySearch(log, t+1)
	for range n {
		log = slices.Insert(log, at, t)
	}
	return log
}

// giveBack takes back the units a limit hands back of an earlier lease,
// when the store still holds them (check.lua's giveBack).
func (s *Memory) giveBack(m *memLimit, now int64) {
	r, W := m.ret, m.spec.WindowMS
	e := s.get(m.key, now)
	switch m.spec.Algorithm {
	case rules.TokenBucket:
		tokens, g := tbNow(e, &m.spec, now)
		switch {
		case r.Tag == g.ag && g.la > 0:
			g.la = max(0, g.la-r.Granted)
		case r.Tag == g.bg && g.lb > 0:
			g.lb = max(0, g.lb-r.Granted)
		default:
			return
		}
		e = s.put(m.key, now)
		e.tokens, e.ts, e.gens = min(max(0, float64(m.spec.Burst)-float64(g.la+g.lb)), tokens+float64(r.Units)), now, g
		e.expireAt = now + tbTTL(&m.spec, &g, now, e.tokens)
	case rules.SlidingWindow:
		idx := now / W
		var cur, prev int64
		if e != nil {
			if e.w == idx {
				cur, prev = e.c, e.p
			} else if e.w == idx-1 {
				prev = e.c
			}
		}
		switch r.Tag {
		case idx:
			cur = max(0, cur-r.Units)
		case idx - 1:
			prev = max(0, prev-r.Units)
		default:
			return
		}
		e = s.put(m.key, now)
		e.w, e.c, e.p, e.expireAt = idx, cur, prev, now+2*W+1000
	case rules.SlidingLog:
		if e == nil || e.leased[r.Tag] == 0 {
			return
		}
		k := min(r.Units, e.leased[r.Tag])
		if e.leased[r.Tag] -= k; e.leased[r.Tag] == 0 {
			delete(e.leased, r.Tag)
		}
		at, _ := slices.BinarySearch(e.log, r.Tag)
		e.log = slices.Delete(e.log, at, at+int(k))
		if len(e.log) == 0 {
			e.expireAt = now // Redis deletes an empty ZSET
		}
	default:
		idx := now / W
		if r.Tag != idx || e == nil || e.w != idx {
			return
		}
		e.c = max(0, e.c-r.Units)
		e.expireAt = now + (idx+1)*W - now + 1000
	}
}

// violate records a violation and blocks the limit once there are enough.
func (s *Memory) violate(m *memLimit, now int64) {
	p := m.spec.Penalty
	v := s.put(m.vkey, now)
	from, _ := slices.BinarySearch(v.log, now-p.DetectionWindowMS+1)
	v.log = append(v.log[:0], v.log[from:]...)
	v.log = append(v.log, now)
	if len(v.log) > rules.MaxViolations {
		v.log = append(v.log[:0], v.log[len(v.log)-rules.MaxViolations:]...)
	}
	v.expireAt = now + p.DetectionWindowMS
	n := int64(len(v.log))
	if n >= p.ViolationThreshold {
		block := m.spec.WindowMS * p.Multipliers[min(n-p.ViolationThreshold, int64(len(p.Multipliers)-1))]
		b := s.put(m.bkey, now)
		b.until, b.expireAt = now+block, now+block
		m.retry, m.reset = max(m.retry, block), max(m.reset, now+block)
	}
}

// Peek implements Store: the limit as a request it would refuse or take
// now sees it (a throttle limit too).
func (s *Memory) Peek(_ context.Context, _ time.Time, l *rules.LimitRequest) (rules.Decision, error) {
	spec := l.Spec
	spec.Cost = 0
	ls := []memLimit{{spec: spec, key: l.Key + keySuffix(&spec)}}
	keys := []string{ls[0].key}
	if p := spec.Penalty; p != nil && p.Enabled {
		ls[0].vkey, ls[0].bkey = l.Key+suffixViolations, l.Key+suffixBlock
		keys = append(keys, ls[0].vkey, ls[0].bkey)
	}
	var buf [4]int
	locked := s.lock(keys, buf[:0])
	defer s.unlock(locked)
	s.decide(ls, s.now(), false)
	m := &ls[0]
	return rules.Decision{Allowed: m.ok && m.remaining > 0, Limit: m.cap, Remaining: m.remaining, ResetMS: m.reset, RetryAfterMS: m.retry}, nil
}

// Reset implements Store.
func (s *Memory) Reset(_ context.Context, key string) error {
	for _, suf := range allSuffixes {
		sh := &s.shards[s.shard(key+suf)]
		sh.mu.Lock()
		delete(sh.m, key+suf)
		sh.mu.Unlock()
	}
	return nil
}

// Ping implements Store.
func (s *Memory) Ping(context.Context) error { return nil }

// Close implements Store.
func (s *Memory) Close() error { return nil }

// Len reports the number of stored keys, expired ones included (tests).
func (s *Memory) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].m)
		s.shards[i].mu.Unlock()
	}
	return n
}
