package store

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// This file is the contract of the Lua scripts: which KEYS and ARGV a call
// carries, in what order, and how the reply reads. Both ways of reaching
// Redis (direct.go's own connections, go-redis for Cluster and Sentinel)
// only serialize what writeCheck lays out, and both read the reply through
// scriptCall.readReply.
//
// check.lua decides a batch of checks in one call, one after the other in
// the order given, each all-or-nothing and seeing what the checks before
// it wrote (exactly as separate calls would, at one Redis TIME):
//
//	KEYS  per check, per limit: its counter key (base key + algorithm
//	      suffix), then, with a penalty, its violations and block keys
//	ARGV  violations cap, number of specs, then per spec: algorithm id,
//	      limit, window_ms, burst, cost, flags (1: log_only, 2: fill, 4: quota),
//	      lease size (0: none), lease ttl_ms, max_delay_ms (-1: not
//	      throttled), calendar months (0: none; a fixed window's),
//	      penalty window_ms (0: no penalty) [, threshold,
//	      number of multipliers, multipliers...]; then the number of
//	      checks, then per check: its number of limits (negative: a peek,
//	      which writes nothing but lease returns), then per limit: its
//	      spec's number (from 1), negative when a lease return follows:
//	      units, tag, granted
//	reply now_ms, then per check: allowed (1; 0: denied; -D: allowed to
//	      pass D ms from now, at the slot its throttle limits reserved;
//	      or, for a check that failed, its error as text), then per limit:
//	      allowed, limit, remaining (a fill limit's: what it had before
//	      the check), reset_ms, retry_after_ms, lease units, lease
//	      ttl_ms, lease tag
//
// A spec is what limits share (the same rule for many clients): sent and
// parsed once per call, it leaves one argument per limit.
//
// refund.lua
//
//	KEYS  the counter keys to refund
//	ARGV  number of limits, then per limit: algorithm id, capacity
//	      (token bucket: burst; others: limit), cost

var (
	//go:embed lua/check.lua
	checkLua string
	//go:embed lua/refund.lua
	refundLua string

	checkScript  = newLuaScript(checkLua)
	refundScript = newLuaScript(refundLua)
)

// luaScript is a script as Redis runs it: EVALSHA by sha, EVAL by source.
type luaScript struct {
	src, sha string
	// clock, in test builds only, is the time a variant of check.lua reads
	// from its last argument instead of Redis TIME, so that the memory
	// store and the script can be compared on one clock. Production
	// scripts have none, and take the time from Redis.
	clock func() int64
}

func newLuaScript(src string) *luaScript {
	sum := sha1.Sum([]byte(src))
	return &luaScript{src: src, sha: hex.EncodeToString(sum[:])}
}

// CheckScript returns the check script's source, for benchmarks with
// redis-benchmark.
func CheckScript() string { return checkLua }

// CheckCommand returns the EVALSHA deciding one check of the limits ls,
// as the bridge sends it: for benchmarks with redis-benchmark.
func CheckCommand(ls []rules.LimitRequest) []string {
	var w stringArgs
	writeCheck(&w, checkScript, []*call{{scriptCall: scriptCall{mode: modeCheck, ls: ls}}}, false, &specTable{})
	return w
}

// stringArgs collects a script command as strings.
type stringArgs []string

func (a *stringArgs) begin(parts int)  { *a = make([]string, 0, parts) }
func (a *stringArgs) bulk(x, y string) { *a = append(*a, x+y) }
func (a *stringArgs) int(n int64)      { *a = append(*a, strconv.FormatInt(n, 10)) }

// scriptMode is what a check does in check.lua.
type scriptMode byte

const (
	modeCheck scriptMode = iota // decide and consume
	modePeek                    // decide, write nothing
)

// Algorithm ids the scripts switch on.
const (
	scriptTokenBucket   = 1
	scriptSlidingWindow = 2
	scriptSlidingLog    = 3
	scriptFixedWindow   = 4
)

func scriptAlgorithm(a rules.Algorithm) int64 {
	switch a {
	case rules.TokenBucket:
		return scriptTokenBucket
	case rules.SlidingWindow:
		return scriptSlidingWindow
	case rules.SlidingLog:
		return scriptSlidingLog
	}
	return scriptFixedWindow
}

// ARGV and reply layout of check.lua.
const (
	checkHeadArgs  = 3  // violations cap, number of specs, number of checks
	specArgs       = 11 // algorithm .. penalty window_ms
	penaltyArgs    = 2  // threshold, number of multipliers (then the multipliers)
	checkArgs      = 1  // per check: number of limits (negative: a peek)
	limitArgs      = 1  // per limit: its spec's number (negative: a return follows)
	returnArgs     = 3  // a lease return: units, tag, granted
	replyHead      = 1  // now_ms
	replyPerCheck  = 1  // allowed, or the check's error
	replyPerLimit  = 8  // allowed, limit, remaining, reset_ms, retry_after_ms, lease units, ttl_ms, tag
	refundHeadArgs = 1  // number of limits
	refundArgs     = 3  // algorithm, capacity, cost
)

// maxTextReply bounds the error text of a failed check in a reply.
const maxTextReply = 64 << 10

// scriptCall is one check in a call of check.lua: the limits idx of ls
// (all when idx is nil) in mode.
type scriptCall struct {
	mode scriptMode
	ls   []rules.LimitRequest
	idx  []int
}

// limits is how many limits the call decides.
func (c *scriptCall) limits() int {
	if c.idx != nil {
		return len(c.idx)
	}
	return len(c.ls)
}

// limit returns the j-th limit the call decides.
func (c *scriptCall) limit(j int) *rules.LimitRequest {
	if c.idx != nil {
		return &c.ls[c.idx[j]]
	}
	return &c.ls[j]
}

// argWriter serializes one script command for a transport.
type argWriter interface {
	begin(parts int)  // the command has this many parts, its name included
	bulk(a, b string) // one part: a followed by b
	int(n int64)      // one part: n in decimal
}

// penalized returns l's penalty when it has one.
func penalized(l *rules.LimitRequest) (*rules.Penalty, bool) {
	p := l.Spec.Penalty
	return p, p != nil && p.Enabled
}

// specTable numbers the distinct specs of a call's limits. Kept by a
// transport and reused from one call to the next.
type specTable struct {
	uniq []*rules.LimitRequest // a limit of each spec, by number - 1
	ref  []int64               // the spec number of each limit of the call, in order
}

// specSearch is how many of the latest specs a limit's is looked up
// among: a batch rarely has more, and the search stays short when it
// does (a spec missed is sent twice, which is harmless).
const specSearch = 16

// number fills t for cs.
func (t *specTable) number(cs []*call) {
	t.uniq, t.ref = t.uniq[:0], t.ref[:0]
	for _, c := range cs {
		for j := range c.limits() {
			l := c.limit(j)
			n := 0
			for i := len(t.uniq) - 1; i >= max(0, len(t.uniq)-specSearch); i-- {
				if sameSpec(t.uniq[i], l) {
					n = i + 1
					break
				}
			}
			if n == 0 {
				t.uniq = append(t.uniq, l)
				n = len(t.uniq)
			}
			t.ref = append(t.ref, int64(n))
		}
	}
}

// sameSpec tells whether a and b send the same spec arguments.
func sameSpec(a, b *rules.LimitRequest) bool {
	sa, sb := &a.Spec, &b.Spec
	if specFlags(a) != specFlags(b) || scriptAlgorithm(sa.Algorithm) != scriptAlgorithm(sb.Algorithm) ||
		sa.Limit != sb.Limit || sa.WindowMS != sb.WindowMS || sa.Months != sb.Months || sa.Burst != sb.Burst || sa.Cost != sb.Cost ||
		leaseOf(a) != leaseOf(b) || a.MaxDelay() != b.MaxDelay() {
		return false
	}
	pa, okA := penalized(a)
	pb, okB := penalized(b)
	if okA != okB {
		return false
	}
	return !okA || pa.DetectionWindowMS == pb.DetectionWindowMS && pa.ViolationThreshold == pb.ViolationThreshold &&
		slices.Equal(pa.Multipliers, pb.Multipliers)
}

// writeCheck writes the EVALSHA of sc (with eval, its EVAL) deciding the
// checks of cs in order. t is scratch space.
func writeCheck(w argWriter, sc *luaScript, cs []*call, eval bool, t *specTable) {
	t.number(cs)
	keys, args := 0, checkHeadArgs+checkArgs*len(cs)+limitArgs*len(t.ref)
	for _, c := range cs {
		for j := range c.limits() {
			keys++
			l := c.limit(j)
			if _, ok := penalized(l); ok {
				keys += 2
			}
			if l.Return.Units > 0 {
				args += returnArgs
			}
		}
	}
	for _, l := range t.uniq {
		args += specArgs
		if p, ok := penalized(l); ok {
			args += penaltyArgs + len(p.Multipliers)
		}
	}
	if sc.clock != nil {
		args++
	}
	w.begin(3 + keys + args)
	if eval {
		w.bulk("EVAL", "")
		w.bulk(sc.src, "")
	} else {
		w.bulk("EVALSHA", "")
		w.bulk(sc.sha, "")
	}
	w.int(int64(keys))
	for _, c := range cs {
		for j := range c.limits() {
			l := c.limit(j)
			w.bulk(l.Key, keySuffix(&l.Spec))
			if _, ok := penalized(l); ok {
				w.bulk(l.Key, suffixViolations)
				w.bulk(l.Key, suffixBlock)
			}
		}
	}
	w.int(rules.MaxViolations)
	w.int(int64(len(t.uniq)))
	for _, l := range t.uniq {
		sp := &l.Spec
		w.int(scriptAlgorithm(sp.Algorithm))
		w.int(sp.Limit)
		w.int(sp.WindowMS)
		w.int(sp.Burst)
		w.int(sp.Cost)
		w.int(specFlags(l))
		lease := leaseOf(l)
		w.int(lease.Size)
		w.int(lease.TTLMS)
		w.int(l.MaxDelay())
		w.int(sp.Months)
		if p, ok := penalized(l); ok {
			w.int(p.DetectionWindowMS)
			w.int(p.ViolationThreshold)
			w.int(int64(len(p.Multipliers)))
			for _, m := range p.Multipliers {
				w.int(m)
			}
		} else {
			w.int(0)
		}
	}
	w.int(int64(len(cs)))
	ref := t.ref
	for _, c := range cs {
		n := c.limits()
		if c.mode == modePeek {
			w.int(int64(-n))
		} else {
			w.int(int64(n))
		}
		for j, r := range ref[:n] {
			if ret := &c.limit(j).Return; ret.Units > 0 {
				w.int(-r)
				w.int(ret.Units)
				w.int(ret.Tag)
				w.int(ret.Granted)
			} else {
				w.int(r)
			}
		}
		ref = ref[n:]
	}
	if sc.clock != nil {
		w.int(sc.clock())
	}
}

// replyReader yields a check.lua reply as a transport reads it.
type replyReader interface {
	// array reads the reply's head: its number of elements, or the
	// error reply Redis gave instead (the whole call failed: NOSCRIPT,
	// BUSY, ...).
	array() (int, error)
	// elem reads the next element: an integer, or text.
	elem() (n int64, text string, isText bool, err error)
}

// readCheckReply reads the reply of the call deciding cs into each
// check's vals (now_ms, allowed, then per limit its eight values, as
// scriptCall.readReply reads them) or err: the error reply of the whole
// call, or the check's own error. It returns an error only when the
// reply is malformed or could not be read; the transport's stream is
// then unusable.
func readCheckReply(r replyReader, cs []*call) error {
	for _, c := range cs {
		c.vals, c.err = c.vals[:0], nil
	}
	n, err := r.array()
	if err != nil {
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			return err
		}
		for _, c := range cs {
			c.err = storeErr(err)
		}
		return nil
	}
	want := replyHead
	for _, c := range cs {
		want += replyPerCheck + replyPerLimit*c.limits()
	}
	if n != want {
		return fmt.Errorf("%w: %d values for %d checks", errProtocol, n, len(cs))
	}
	now, _, isText, err := r.elem()
	if err != nil {
		return err
	}
	if isText {
		return errProtocol
	}
	for _, c := range cs {
		allowed, text, isText, err := r.elem()
		if err != nil {
			return err
		}
		if isText {
			c.err = storeErr(replyError(text))
		}
		c.vals = append(c.vals, now, allowed)
		for range replyPerLimit * c.limits() {
			v, _, isText, err := r.elem()
			if err != nil {
				return err
			}
			if isText {
				return errProtocol
			}
			c.vals = append(c.vals, v)
		}
	}
	return nil
}

// specFlags is a spec's flags argument.
func specFlags(l *rules.LimitRequest) int64 {
	var f int64
	if l.LogOnly {
		f |= 1
	}
	if l.Fill {
		f |= 2
	}
	if l.Quota {
		f |= 4
	}
	return f
}

// leaseOf is the lease l asks for: none for a fill limit, whose cost is
// not known before it is decided, nor for one of calendar months (a
// per-user override may have made a leased limit one).
func leaseOf(l *rules.LimitRequest) rules.Lease {
	if l.Fill || l.Spec.Months > 0 {
		return rules.Lease{}
	}
	return l.Spec.Lease
}

// readReply copies the check's part of a check.lua reply (now_ms,
// allowed, then per limit eight values: vals as readCheckReply leaves
// them) into resp.Decisions (at c.idx when set) and returns the check's
// allowed flag; with c.idx nil it sets resp.Allowed and resp.DelayMS too. resp.NowMS
// becomes the latest time seen.
func (c *scriptCall) readReply(v []int64, resp *rules.CheckResponse) (bool, error) {
	n := c.limits()
	if len(v) != replyHead+replyPerCheck+replyPerLimit*n {
		return false, fmt.Errorf("redis script: unexpected answer (%d values for %d limits)", len(v), n)
	}
	resp.NowMS = max(resp.NowMS, v[0])
	for j := range n {
		i := j
		if c.idx != nil {
			i = c.idx[j]
		}
		r := v[replyHead+replyPerCheck+replyPerLimit*j:]
		resp.Decisions[i] = rules.Decision{Allowed: r[0] == 1, Limit: r[1], Remaining: r[2], ResetMS: r[3], RetryAfterMS: r[4],
			Lease: rules.LeaseGrant{Units: r[5], TTLMS: r[6], Tag: r[7]}}
	}
	allowed := v[1] == 1 || v[1] < 0
	if c.idx == nil {
		resp.Allowed = allowed
		resp.DelayMS = max(0, -v[1])
	}
	return allowed, nil
}

// writeRefund writes the EVALSHA of refund.lua giving back what the
// limits idx of ls consumed (those whose decision allowed). It returns
// false, writing nothing, when none did.
func writeRefund(w argWriter, ls []rules.LimitRequest, idx []int, ds []rules.Decision) bool {
	n := 0
	for _, i := range idx {
		if ds[i].Allowed {
			n++
		}
	}
	if n == 0 {
		return false
	}
	w.begin(3 + n + refundHeadArgs + refundArgs*n)
	w.bulk("EVALSHA", "")
	w.bulk(refundScript.sha, "")
	w.int(int64(n))
	for _, i := range idx {
		if ds[i].Allowed {
			w.bulk(ls[i].Key, keySuffix(&ls[i].Spec))
		}
	}
	w.int(int64(n))
	for _, i := range idx {
		if ds[i].Allowed {
			sp := &ls[i].Spec
			w.int(scriptAlgorithm(sp.Algorithm))
			if sp.Algorithm == rules.TokenBucket {
				w.int(sp.Burst)
			} else {
				w.int(sp.Limit)
			}
			w.int(ls[i].Taken(&ds[i]))
		}
	}
	return true
}
