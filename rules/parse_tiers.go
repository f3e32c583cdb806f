package rules

// Parsing of tiers: plans such as free/premium with per-endpoint overrides.

import (
	"math/bits"
	"strconv"

	"github.com/tidwall/gjson"
)

func (p *parser) tiers(v gjson.Result, path string, defPenalty *Penalty) TierConfig {
	var t TierConfig
	if !v.Exists() {
		return t
	}
	if !p.object(v, path, "header", "claim", "default", "list") {
		return t
	}
	t.Header = p.headerName(v.Get("header"), join(path, "header"), "")
	t.Claim = p.str(v.Get("claim"), join(path, "claim"), "")
	lp := join(path, "list")
	list := v.Get("list")
	if !list.IsArray() || len(list.Array()) == 0 {
		p.fail(lp, "must be a non-empty array of tiers")
		return t
	}
	fields := append([]string{"name", "unlimited", "scope", "endpoints", "action", "max_delay", "on_response"}, limitFields...)
	for i, e := range list.Array() {
		tp := index(lp, i)
		if !p.object(e, tp, fields...) {
			return t
		}
		tier := Tier{Name: p.name(e.Get("name"), join(tp, "name"))}
		tier.Unlimited = p.boolean(e.Get("unlimited"), join(tp, "unlimited"), false)
		tier.Scope = p.scope(e.Get("scope"), join(tp, "scope"), "user")
		if tier.Unlimited {
			for _, f := range append([]string{"endpoints", "action", "max_delay", "on_response"}, limitFields...) {
				if e.Get(f).Exists() {
					p.fail(join(tp, f), "an unlimited tier has no limits")
				}
			}
		} else {
			tier.Action = p.action(e.Get("action"), join(tp, "action"))
			tier.Spec = p.limitSpec(e, tp, actionDefault(LimitSpec{}, tier.Action), defPenalty)
			tier.MaxDelayMS = p.limitAction(e, tp, tier.Action, &tier.Spec)
			tier.Endpoints = p.endpointOverrides(e.Get("endpoints"), join(tp, "endpoints"), tier.Spec, tier.Action, defPenalty)
			if v := e.Get("on_response"); v.Exists() {
				leased := tier.Spec.Lease.Size > 0
				for _, o := range tier.Endpoints {
					leased = leased || o.Spec.Lease.Size > 0
				}
				tier.OnResponse = p.onResponse(v, join(tp, "on_response"), tier.Action, leased)
			}
		}
		for j := range t.List {
			if t.List[j].Name == tier.Name && p.err == nil {
				p.fail(join(tp, "name"), "%q is already the name of %s", tier.Name, index(lp, j))
			}
		}
		t.List = append(t.List, tier)
	}
	t.Default = p.str(v.Get("default"), join(path, "default"), "")
	if p.err != nil {
		return t
	}
	if t.Default == "" {
		t.Default = t.List[0].Name
	} else if t.Find(t.Default) == nil {
		p.fail(join(path, "default"), "%q is not one of the tiers in list", t.Default)
	}
	t.setKeyNames()
	return t
}

// endpointOverrides reads {"/path": 50} or {"/path": {"limit": 50, "window": "1m"}}.
// An override takes its tier's action; a throttle tier's overrides are
// checked as throttle limits.
func (p *parser) endpointOverrides(v gjson.Result, path string, base LimitSpec, action Action, defPenalty *Penalty) []EndpointOverride {
	if !v.Exists() {
		return nil
	}
	if !v.IsObject() {
		p.fail(path, `must be an object of path pattern to limit, e.g. {"/api/v1/search": 50}`)
		return nil
	}
	var out []EndpointOverride
	seen := map[string]bool{}
	v.ForEach(func(k, e gjson.Result) bool {
		ep := path + "[" + strconv.Quote(k.Str) + "]"
		if seen[k.Str] {
			p.fail(ep, "given twice")
			return false
		}
		seen[k.Str] = true
		pp, err := ParsePathPattern(k.Str)
		if err != nil {
			p.fail(ep, "%v", err)
			return false
		}
		o := EndpointOverride{Match: pp}
		if e.Type == gjson.Number {
			o.Spec = base
			o.Spec.Limit = p.integer(e, ep, 0, 1, MaxLimitValue)
			if base.Algorithm == TokenBucket && base.Burst == base.Limit {
				o.Spec.Burst = o.Spec.Limit
			} else if base.Algorithm != TokenBucket {
				o.Spec.Burst = o.Spec.Limit
			}
			if o.Spec.Cost > max(o.Spec.Limit, o.Spec.Burst) {
				p.fail(ep, "is %d, less than the cost %d: no request could ever pass", o.Spec.Limit, o.Spec.Cost)
			}
			if o.Spec.Lease.Size > max(o.Spec.Limit, o.Spec.Burst) {
				p.fail(ep, "is %d, less than the tier's lease size %d: give the override a lease of its own", o.Spec.Limit, o.Spec.Lease.Size)
			}
		} else {
			if !p.object(e, ep, limitFields...) {
				return false
			}
			inherited := base
			if e.Get("limit").Exists() {
				inherited.Burst = 0 // recomputed from the new limit unless given
			}
			o.Spec = p.limitSpec(e, ep, inherited, defPenalty)
			if !e.Get("cost").Exists() {
				o.Spec.Cost = base.Cost // the tier's, 0 included (on_response)
			}
			p.actionSpec(ep, action, &o.Spec)
		}
		if p.err == nil && looser(&o.Spec, &base) {
			p.fail(ep, "%s is looser than the tier's %s: an endpoint override can only tighten its tier (the most restrictive limit wins)",
				describeSpec(&o.Spec), describeSpec(&base))
		}
		out = append(out, o)
		return p.err == nil
	})
	return out
}

// looser reports whether o lets more requests through than t: more at once
// (its capacity) or more over time (its rate), counted in requests of their
// cost. The algorithms are not compared, only these two numbers.
func looser(o, t *LimitSpec) bool {
	// A cost of 0 (charged after the response, by what it says) counts
	// as 1 here: the limits are compared in units.
	oc, tc := max(o.Cost, 1), max(t.Cost, 1)
	// capacity(o)/oc > capacity(t)/tc, multiplied out.
	if greater(mul(capacity(o), tc, 1), mul(capacity(t), oc, 1)) {
		return true
	}
	// o.Limit/(oc·o.WindowMS) > t.Limit/(tc·t.WindowMS)
	return greater(mul(o.Limit, tc, t.WindowMS), mul(t.Limit, oc, o.WindowMS))
}

// capacity is how many units a limit lets through at once.
func capacity(s *LimitSpec) int64 {
	if s.Algorithm == TokenBucket {
		return s.Burst
	}
	return s.Limit
}

// mul returns a·b·c as a 128-bit number. Limits and costs are at most
// 2^40 and windows under 2^35, so the product fits.
func mul(a, b, c int64) [2]uint64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	h2, l2 := bits.Mul64(lo, uint64(c))
	return [2]uint64{hi*uint64(c) + h2, l2}
}

func greater(x, y [2]uint64) bool { return x[0] > y[0] || x[0] == y[0] && x[1] > y[1] }

// describeSpec renders a limit for error messages: "20 per 1m", with the
// burst and cost when they matter.
func describeSpec(s *LimitSpec) string {
	d := strconv.FormatInt(s.Limit, 10) + " per " + string(s.AppendWindow(nil))
	if s.Algorithm == TokenBucket && s.Burst != s.Limit {
		d += " (burst " + strconv.FormatInt(s.Burst, 10) + ")"
	}
	if s.Cost != 1 {
		d += " at cost " + strconv.FormatInt(s.Cost, 10)
	}
	return d
}

// Find returns the tier with the given name, or nil.
func (t *TierConfig) Find(name string) *Tier {
	for i := range t.List {
		if t.List[i].Name == name {
			return &t.List[i]
		}
	}
	return nil
}
