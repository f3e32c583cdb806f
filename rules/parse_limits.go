package rules

// Parsing of what every limit shares: its limit fields, scope, action,
// name and path patterns.

import (
	"strings"

	"github.com/tidwall/gjson"
)

// limitFields are the fields every limit-bearing object shares.
var limitFields = []string{"algorithm", "limit", "window", "burst", "cost", "penalty", "lease"}

// limitSpec reads the limit fields of v; def supplies inherited values.
func (p *parser) limitSpec(v gjson.Result, path string, def LimitSpec, defPenalty *Penalty) LimitSpec {
	s := def
	if a := v.Get("algorithm"); a.Exists() || s.Algorithm == 0 {
		name := p.str(a, join(path, "algorithm"), "sliding_window")
		alg, ok := ParseAlgorithm(name)
		if !ok {
			p.fail(join(path, "algorithm"), "must be one of token_bucket, sliding_window, sliding_log, fixed_window; got %q", name)
		}
		s.Algorithm = alg
	}
	s.Limit = p.integer(v.Get("limit"), join(path, "limit"), s.Limit, 1, MaxLimitValue)
	if s.Limit == 0 && p.err == nil {
		p.fail(join(path, "limit"), "is required (requests per window, > 0)")
	}
	if w := v.Get("window"); w.Exists() {
		s.WindowMS, s.Months = p.window(w, join(path, "window"))
	}
	if s.WindowMS == 0 && p.err == nil {
		p.fail(join(path, "window"), `is required (a duration such as "1m")`)
	}
	if s.Months > 0 && s.Algorithm != FixedWindow && p.err == nil {
		// Only a fixed window resets at a point in time; the others slide.
		p.fail(join(path, "algorithm"), `is %s: a window of calendar months ("1mo") needs "algorithm": "fixed_window"`, s.Algorithm)
	}
	if b := v.Get("burst"); b.Exists() {
		if s.Algorithm != TokenBucket {
			p.fail(join(path, "burst"), "only for algorithm token_bucket (the bucket capacity)")
		}
		s.Burst = p.integer(b, join(path, "burst"), 0, 1, MaxLimitValue)
	} else if s.Algorithm != TokenBucket || s.Burst == 0 {
		// Only a token bucket has a capacity apart from its rate.
		s.Burst = s.Limit
	}
	// A limit charged after the response may cost 0: a response that does
	// not say what it cost then charges nothing.
	minCost := int64(1)
	if v.Get("on_response").Exists() {
		minCost = 0
	}
	s.Cost = p.integer(v.Get("cost"), join(path, "cost"), max(s.Cost, 1), minCost, MaxLimitValue)
	if capacity := max(s.Limit, s.Burst); s.Cost > capacity && p.err == nil {
		p.fail(join(path, "cost"), "is %d, more than the limit %d: no request could ever pass", s.Cost, capacity)
	}
	if pv := v.Get("penalty"); pv.Exists() {
		pen := p.penalty(pv, join(path, "penalty"), defPenalty)
		if pen.Enabled {
			s.Penalty = &pen
		} else {
			s.Penalty = nil
		}
	} else if def.Penalty == nil {
		s.Penalty = defPenalty
	}
	if lv := v.Get("lease"); lv.Exists() {
		s.Lease = p.lease(lv, join(path, "lease"))
	}
	p.checkLease(&s, path)
	return s
}

// Lease bounds. A lease is spent by a proxy's clock: a minute bounds what a
// proxy that stops answering can hold back, and what a grant spends after
// the bridge can no longer be reached.
const (
	DefaultLeaseTTLMS = 1000
	MaxLeaseTTLMS     = 60_000
)

func (p *parser) lease(v gjson.Result, path string) Lease {
	if !p.object(v, path, "size", "ttl") {
		return Lease{}
	}
	l := Lease{
		Size:  p.integer(v.Get("size"), join(path, "size"), 0, 1, MaxLimitValue),
		TTLMS: p.duration(v.Get("ttl"), join(path, "ttl"), DefaultLeaseTTLMS, 1, MaxLeaseTTLMS),
	}
	if l.Size == 0 && p.err == nil {
		p.fail(join(path, "size"), "is required (units one grant holds, > 0)")
	}
	return l
}

// checkLease refuses a lease that could never be spent or that would
// hide what the bridge must see: a limit with a penalty counts its
// violations at the bridge, so it is never leased.
func (p *parser) checkLease(s *LimitSpec, path string) {
	if s.Lease.Size == 0 || p.err != nil {
		return
	}
	lp := join(path, "lease")
	switch capacity := max(s.Limit, s.Burst); {
	case s.Months > 0:
		p.fail(lp, "a limit of calendar months is never leased (a grant lasts its ttl, and such a window is a month)")
	case s.Penalty != nil:
		p.fail(lp, `a limit with a penalty is never leased (its violations are counted by the bridge); set "penalty": {"enabled": false} on it or drop the lease`)
	case s.Lease.Size < s.Cost:
		p.fail(join(lp, "size"), "is %d, less than the cost %d: a grant could not pay for one request", s.Lease.Size, s.Cost)
	case s.Lease.Size > capacity:
		p.fail(join(lp, "size"), "is %d, more than the limit %d", s.Lease.Size, capacity)
	}
}

// scope parses "user+endpoint".
func (p *parser) scope(v gjson.Result, path, def string) Scope {
	text := p.str(v, path, def)
	var s Scope
	for _, part := range strings.Split(text, "+") {
		found := false
		for _, n := range scopePartNames {
			if n.name == strings.TrimSpace(part) {
				if s.Has(n.part) {
					p.fail(path, "%q names %s twice", text, n.name)
				}
				s |= Scope(n.part)
				found = true
			}
		}
		if !found {
			p.fail(path, "unknown scope %q in %q (known: global, ip, user, api_key, tenant, endpoint, method, joined with +)", part, text)
			return s
		}
	}
	if s.Has(ScopeGlobal) && s != Scope(ScopeGlobal) {
		p.fail(path, "global cannot be combined with other parts")
	}
	return s
}

func (p *parser) action(v gjson.Result, path string) Action {
	switch a := p.str(v, path, "reject"); a {
	case "reject":
		return Reject
	case "log_only":
		return LogOnly
	case "throttle":
		return Throttle
	default:
		p.fail(path, `must be "reject", "throttle" or "log_only", got %q`, a)
	}
	return Reject
}

// limitAction checks what a limit's action asks of its spec s, read from
// the object v at path, and returns its max_delay (throttle only).
func (p *parser) limitAction(v gjson.Result, path string, a Action, s *LimitSpec) int64 {
	md := v.Get("max_delay")
	var maxDelay int64
	if a == Throttle {
		maxDelay = p.duration(md, join(path, "max_delay"), DefaultMaxDelayMS, 1, MaxMaxDelayMS)
	} else if md.Exists() {
		p.fail(join(path, "max_delay"), `only for action "throttle"`)
	}
	p.actionSpec(path, a, s)
	return maxDelay
}

// actionDefault is the spec a limit with action a starts from, def
// otherwise: a throttle limit reserves a slot for each request it holds,
// which only an exact count can do, so one whose algorithm is left out is
// a token bucket (throttled, it spaces requests as a leaky bucket does)
// rather than the estimating sliding_window.
func actionDefault(def LimitSpec, a Action) LimitSpec {
	if a == Throttle && (def.Algorithm == 0 || def.Algorithm == SlidingWindow) {
		def.Algorithm, def.Burst = TokenBucket, 0
	}
	return def
}

// actionSpec checks the spec s of a limit with action a, read at path. A
// log_only limit never denies, so the bridge counts it on every request:
// it is never leased. Nor is a throttle limit, each request it holds
// reserving its own slot; and it cannot be a sliding_window, an estimate
// (actionDefault).
func (p *parser) actionSpec(path string, a Action, s *LimitSpec) {
	switch {
	case a == LogOnly && s.Lease.Size > 0:
		p.fail(join(path, "lease"), "a log_only limit is never leased (the bridge counts what it would deny)")
	case a != Throttle:
	case s.Algorithm == SlidingWindow:
		p.fail(join(path, "algorithm"), "a throttle limit needs token_bucket, fixed_window or sliding_log: sliding_window estimates its count and cannot reserve a request's slot")
	case s.Months > 0:
		p.fail(join(path, "window"), "a throttle limit needs a window of fixed length, not calendar months")
	case s.Lease.Size > 0:
		p.fail(join(path, "lease"), "a throttle limit is never leased (each request it holds reserves its own slot at the bridge)")
	}
}

// name validates a rule, category or tier name: it becomes part of counter
// keys, metric labels and header values.
func (p *parser) name(v gjson.Result, path string) string {
	n := p.str(v, path, "")
	if n == "" {
		if p.err == nil {
			p.fail(path, "is required")
		}
		return n
	}
	if len(n) > MaxRuleNameLen {
		p.fail(path, "must be at most %d bytes", MaxRuleNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			p.fail(path, "%q may hold only a-z, 0-9, _ and -", n)
			break
		}
	}
	return n
}

func (p *parser) pathPatterns(v gjson.Result, path string) []PathPattern {
	var out []PathPattern
	for _, s := range p.strings(v, path, nil) {
		pp, err := ParsePathPattern(s)
		if err != nil {
			p.fail(path, "%q: %v", s, err)
			return nil
		}
		out = append(out, pp)
	}
	return out
}
