package filter

import (
	"strconv"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Rules from the bridge (rules_from): every interval the root context
// asks the bridge for its policy, saying which version it holds; a new
// version is validated with the configuration's own rules
// (rules.Config.WithPolicy) and applied whole, or refused whole. Requests
// never wait for this: a stream takes the configuration in force when it
// starts.

// policyState is what the plugin knows of the bridge's policy.
type policyState struct {
	base     *rules.Config       // the plugin's own configuration
	version  rules.PolicyVersion // applied; zero: none
	doc      []byte              // the document applied, kept to merge it into a new configuration
	etag     string              // sent as If-None-Match: the version applied, or one refused
	inFlight bool
	callID   uint32
	every    uint32 // fetch every this many ticks
	ticks    uint32
	down     bool // the last fetch failed (logged once until one succeeds)
	hdrs     [][2]string
}

// tickPeriod is the tick of the root context in ms: once a second, or
// the rules_from interval when shorter, or a tenth of the shortest lease
// ttl (at least 100 ms) when shorter, so that a lease that ended is
// handed back soon after.
func tickPeriod(cfg *rules.Config) uint32 {
	period := uint32(1000)
	if rf := cfg.RulesFrom; rf != nil && rf.IntervalMS < period {
		period = rf.IntervalMS
	}
	if ttl := cfg.ShortestLeaseTTLMS(); ttl > 0 {
		period = min(period, uint32(max(100, ttl/10)))
	}
	return period
}

// startPolicy adopts a new configuration of the plugin: the policy last
// applied is merged into it when it still fits, and the policy is asked
// for at once.
func (p *Plugin) startPolicy(cfg *rules.Config) {
	ps := &p.policy
	ps.base = cfg
	ps.ticks = 0
	rf := cfg.RulesFrom
	if rf == nil {
		ps.version, ps.doc, ps.etag = rules.PolicyVersion{}, nil, ""
		return
	}
	period := tickPeriod(cfg)
	ps.every = (rf.IntervalMS + period - 1) / period
	ps.etag = ""
	if ps.doc != nil {
		merged, v, err := cfg.WithPolicy(ps.doc)
		if err != nil {
			p.logf(proxywasm.LogLevelWarn, "sluice: the policy from the bridge does not fit the new configuration; its own rules apply until the next policy: ", err.Error())
			ps.version, ps.doc = rules.PolicyVersion{}, nil
		} else {
			p.cfg, ps.version, ps.etag = merged, v, v.ETag()
		}
	}
	p.fetchPolicy()
}

// policyTick asks for the policy every rules_from.interval.
func (p *Plugin) policyTick() {
	ps := &p.policy
	if ps.base == nil || ps.base.RulesFrom == nil {
		return
	}
	if ps.ticks++; ps.ticks < ps.every {
		return
	}
	ps.ticks = 0
	p.fetchPolicy()
}

func (p *Plugin) fetchPolicy() {
	ps := &p.policy
	if ps.inFlight || !ps.base.Enabled {
		return
	}
	rf := ps.base.RulesFrom
	ps.hdrs = append(ps.hdrs[:0], [2]string{":method", "GET"}, [2]string{":path", rf.Path}, [2]string{":authority", rf.Authority})
	if p.bridgeAuth != "" {
		ps.hdrs = append(ps.hdrs, [2]string{"authorization", p.bridgeAuth})
	}
	if ps.etag != "" {
		ps.hdrs = append(ps.hdrs, [2]string{"if-none-match", ps.etag})
	}
	id, err := p.host.Dispatch(rf.Cluster, ps.hdrs, nil, rf.TimeoutMS)
	if err != nil {
		p.policyFailed("dispatch failed: " + err.Error())
		return
	}
	ps.inFlight, ps.callID = true, id
}

// onPolicyResponse handles the answer to fetchPolicy.
func (p *Plugin) onPolicyResponse(numHeaders, bodySize int) {
	p.policy.inFlight = false
	if numHeaders == 0 {
		p.policyFailed("bridge unreachable or timed out")
		return
	}
	status, body := p.host.CallResponse(bodySize)
	switch status {
	case "304":
		p.policyReached()
	case "200":
		p.policyReached()
		p.applyPolicy(body)
	default:
		p.policyFailed("bridge answered status " + status)
	}
}

// applyPolicy applies a policy document the bridge sent, or refuses it
// and keeps the rules in force.
func (p *Plugin) applyPolicy(doc []byte) {
	ps := &p.policy
	merged, v, err := ps.base.WithPolicy(doc)
	if err != nil {
		p.host.IncCounter(p.m.policyRefused)
		p.logf(proxywasm.LogLevelError, "sluice: policy from the bridge refused, keeping ", ps.describe(), ": ", err.Error())
		if v.Store != "" {
			ps.etag = v.ETag() // not again until it changes
		}
		return
	}
	if ps.doc != nil && !v.Newer(ps.version) {
		return // a bridge behind another: the newer version stays
	}
	p.cfg = merged
	ps.version, ps.etag = v, v.ETag()
	ps.doc = append(ps.doc[:0], doc...) // doc is a view of host memory
	p.host.IncCounter(p.m.policyApplied)
	p.logf(proxywasm.LogLevelInfo, "sluice: policy from the bridge applied: ", ps.describe(), ", ",
		strconv.Itoa(len(merged.Rules)-len(ps.base.Rules)), " rules")
}

func (ps *policyState) describe() string {
	if ps.doc == nil {
		return "no policy"
	}
	return "version " + strconv.FormatInt(ps.version.Version, 10)
}

func (p *Plugin) policyFailed(reason string) {
	p.host.IncCounter(p.m.policyErrors)
	if !p.policy.down {
		p.policy.down = true
		p.logf(proxywasm.LogLevelWarn, "sluice: rules_from: cannot fetch the policy (", reason, "); keeping ", p.policy.describe())
	}
}

func (p *Plugin) policyReached() {
	if p.policy.down {
		p.policy.down = false
		p.logf(proxywasm.LogLevelInfo, "sluice: rules_from: the bridge answers again")
	}
}
