package store

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"

	"github.com/sluicehq/sluice/rules"
)

// This file is the contract of the Lua scripts: which KEYS and ARGV a call
// carries, in what order, and how the reply reads. Both ways of reaching
// Redis (direct.go's own connections, go-redis for Cluster and Sentinel)
// only serialize what writeCheck lays out, and both read the reply through
// scriptCall.readReply.
//
// check.lua
//
//	KEYS  per limit: its counter key (base key + algorithm suffix), then,
//	      with a penalty, its violations and block keys
//	ARGV  mode, violations cap, number of limits, then per limit:
//	      algorithm id, limit, window_ms, burst, cost, log_only (0/1),
//	      penalty window_ms (0: no penalty)
//	      [, threshold, number of multipliers, multipliers...]
//	reply now_ms, allowed (0/1), then per limit:
//	      allowed, limit, remaining, reset_ms, retry_after_ms
//
// refund.lua
//
//	KEYS  the counter keys to refund
//	ARGV  number of limits, then per limit: algorithm id, burst, cost

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
// redis-benchmark (ARGV as writeCheck lays them out).
func CheckScript() string { return checkLua }

// scriptMode is what a check.lua call does.
type scriptMode string

const (
	modeCheck scriptMode = "c" // decide and consume
	modePeek  scriptMode = "p" // decide, write nothing
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
	checkHeadArgs  = 3 // mode, violations cap, number of limits
	limitArgs      = 7 // algorithm .. penalty window_ms
	penaltyArgs    = 2 // threshold, number of multipliers (then the multipliers)
	replyHead      = 2 // now_ms, allowed
	replyPerLimit  = 5 // allowed, limit, remaining, reset_ms, retry_after_ms
	maxCheckReply  = replyHead + replyPerLimit*rules.MaxLimitsPerCheck
	refundHeadArgs = 1 // number of limits
	refundArgs     = 3 // algorithm, burst, cost
)

// scriptCall is one call of check.lua: the limits idx of ls (all when idx
// is nil) in mode.
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

// writeCheck writes the EVALSHA of sc for c, or with eval its EVAL.
func writeCheck(w argWriter, sc *luaScript, c *scriptCall, eval bool) {
	n := c.limits()
	keys, args := 0, checkHeadArgs
	for j := range n {
		keys++
		args += limitArgs
		if p, ok := penalized(c.limit(j)); ok {
			keys += 2
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
	for j := range n {
		l := c.limit(j)
		w.bulk(l.Key, algSuffix(l.Spec.Algorithm))
		if _, ok := penalized(l); ok {
			w.bulk(l.Key, suffixViolations)
			w.bulk(l.Key, suffixBlock)
		}
	}
	w.bulk(string(c.mode), "")
	w.int(rules.MaxViolations)
	w.int(int64(n))
	for j := range n {
		l := c.limit(j)
		sp := &l.Spec
		w.int(scriptAlgorithm(sp.Algorithm))
		w.int(sp.Limit)
		w.int(sp.WindowMS)
		w.int(sp.Burst)
		w.int(sp.Cost)
		w.int(boolArg(l.LogOnly))
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
	if sc.clock != nil {
		w.int(sc.clock())
	}
}

func boolArg(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// readReply copies a check.lua reply into resp.Decisions (at c.idx when
// set) and returns the script's allowed flag; with c.idx nil it sets
// resp.Allowed too. resp.NowMS becomes the latest time seen.
func (c *scriptCall) readReply(v []int64, resp *rules.CheckResponse) (bool, error) {
	n := c.limits()
	if len(v) != replyHead+replyPerLimit*n {
		return false, fmt.Errorf("redis script: unexpected answer (%d values for %d limits)", len(v), n)
	}
	resp.NowMS = max(resp.NowMS, v[0])
	for j := range n {
		i := j
		if c.idx != nil {
			i = c.idx[j]
		}
		r := v[replyHead+replyPerLimit*j:]
		resp.Decisions[i] = rules.Decision{Allowed: r[0] == 1, Limit: r[1], Remaining: r[2], ResetMS: r[3], RetryAfterMS: r[4]}
	}
	allowed := v[1] == 1
	if c.idx == nil {
		resp.Allowed = allowed
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
			w.bulk(ls[i].Key, algSuffix(ls[i].Spec.Algorithm))
		}
	}
	w.int(int64(n))
	for _, i := range idx {
		if ds[i].Allowed {
			sp := &ls[i].Spec
			w.int(scriptAlgorithm(sp.Algorithm))
			w.int(sp.Burst)
			w.int(sp.Cost)
		}
	}
	return true
}
