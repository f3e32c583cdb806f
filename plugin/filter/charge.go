package filter

import (
	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Limits charged after the response (a rule's on_response, docs/config.md):
// the request's check only asks whether they have anything left; once
// the response's headers are in, one more call-out charges them what the
// response cost. The response is not held for it: its answer only counts.

// chargedAfter reports whether limits has one charged after the response.
func chargedAfter(limits []rules.PlannedLimit) bool {
	for i := range limits {
		if limits[i].OnResponse != nil {
			return true
		}
	}
	return false
}

// charge sends the check that charges s's limits charged after the
// response what the response cost (rules.OnResponse.Charge); nothing when
// it cost none of them anything.
func (s *Stream) charge() {
	p, h := s.p, s.p.host
	status := rules.StatusCode(h.ResponseHeader(":status"))
	n := 0
	for i := range s.plan.Limits {
		l := &s.plan.Limits[i]
		if l.OnResponse == nil {
			continue
		}
		var cost string
		if l.OnResponse.CostHeader != "" {
			cost = h.ResponseHeader(l.OnResponse.CostHeader)
		}
		if l.Charge = l.OnResponse.Charge(status, cost, l.Spec.Cost); l.Charge > 0 {
			n++
		}
	}
	if n == 0 {
		return
	}
	rid := bytesString(s.requestID)
	s.body = rules.AppendChargeRequest(s.body[:0], rid, s.plan.Identity.User, s.plan.Endpoint, s.plan.Limits)
	b := &s.cfg.Bridge
	s.callHdrs = p.appendCallHeaders(s.callHdrs[:0], b, rid)
	h.IncCounter(p.m.charges)
	id, err := h.Dispatch(b.Cluster, s.callHdrs, s.body, b.TimeoutMS)
	if err != nil {
		p.chargeFailed("dispatch failed: " + err.Error())
		return
	}
	p.charges[id] = struct{}{}
}

// chargeResponse handles the bridge's answer to a charge; false when
// calloutID is not one.
func (p *Plugin) chargeResponse(calloutID uint32, numHeaders, bodySize int) bool {
	if len(p.charges) == 0 {
		return false
	}
	if _, ok := p.charges[calloutID]; !ok {
		return false
	}
	delete(p.charges, calloutID)
	if numHeaders == 0 {
		p.chargeFailed("bridge unreachable or timed out")
		return true
	}
	if status, _ := p.host.CallResponse(bodySize); status != "200" {
		p.chargeFailed("bridge answered status " + status)
	}
	return true
}

// chargeFailed counts and logs a charge the bridge did not take. It is not
// sent again: the bridge may have taken it before the failure showed.
func (p *Plugin) chargeFailed(reason string) {
	p.host.IncCounter(p.m.chargeErrors)
	b := append(p.event[:0], `{"timestamp":"`...)
	b = appendTimestamp(b, p.host.NowNanos()/1e6)
	b = append(b, `","event_type":"charge_error","reason":`...)
	b = rules.AppendJSONString(b, reason)
	b = append(b, '}')
	p.event = b
	p.host.Log(proxywasm.LogLevelWarn, b)
}
