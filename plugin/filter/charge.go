package filter

import (
	"strings"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Limits charged after the response (on_response, docs/config.md): the
// request's check only asks whether they have anything left; once the
// response says what the request cost (its status and a header, or a
// number in its body), one more call-out charges them. The response is not
// held for it: its answer only counts.

// chargedAfter reports whether limits has one charged after the response.
func chargedAfter(limits []rules.PlannedLimit) bool {
	for i := range limits {
		if limits[i].OnResponse != nil {
			return true
		}
	}
	return false
}

// readsBody reports whether limits has one whose cost is in the response
// body (cost_body).
func readsBody(limits []rules.PlannedLimit) bool {
	for i := range limits {
		if o := limits[i].OnResponse; o != nil && o.CostBody != nil {
			return true
		}
	}
	return false
}

// bodyCost reads the cost of one limit from the response body.
type bodyCost struct {
	limit int // index in the plan's limits
	cost  rules.BodyCost
}

// bodyCosts are a stream's; Write feeds each a part of the body.
type bodyCosts []bodyCost

func (b *bodyCosts) Write(p []byte) (int, error) {
	for i := range *b {
		(*b)[i].cost.Write(p)
	}
	return len(p), nil
}

// chargeHeaders works out, from the response's headers, what the stream's
// limits charged after the response cost, and charges them; a limit whose
// cost is in the body waits for it (endOfStream: there is none).
func (s *Stream) chargeHeaders(endOfStream bool) {
	h := s.p.host
	s.status = rules.StatusCode(h.ResponseHeader(":status"))
	s.bodies = s.bodies[:0]
	checked, readable, sse := false, false, false
	for i := range s.plan.Limits {
		l := &s.plan.Limits[i]
		o := l.OnResponse
		if o == nil {
			continue
		}
		var n int64
		var said bool
		switch {
		case o.CostHeader != "":
			n, said = rules.HeaderCost(h.ResponseHeader(o.CostHeader))
		case o.CostBody != nil && o.Charges(s.status):
			if !checked {
				checked = true
				readable, sse = s.readableBody(endOfStream)
			}
			if readable {
				s.bodies = append(s.bodies, bodyCost{limit: i})
				s.bodies[len(s.bodies)-1].cost.Reset(o.CostBody, sse)
				continue
			}
			h.IncCounter(s.p.m.bodyUnread)
		}
		l.Charge = o.Charge(s.status, n, said, l.Spec.Cost)
	}
	if len(s.bodies) == 0 {
		s.charge()
	}
}

// readableBody reports whether the response has a body that can be read
// for its cost (a compressed one cannot), and whether it is an event
// stream.
func (s *Stream) readableBody(endOfStream bool) (readable, sse bool) {
	h := s.p.host
	if endOfStream {
		return false, false
	}
	if enc := h.ResponseHeader("content-encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return false, false
	}
	return true, isEventStream(h.ResponseHeader("content-type"))
}

// OnResponseBody reads the body of a response whose cost is in it; at its
// end the stream's limits are charged.
func (s *Stream) OnResponseBody(size int, endOfStream bool) proxywasm.Action {
	if len(s.bodies) == 0 {
		return proxywasm.Continue
	}
	if size > 0 {
		s.p.host.ReadResponseBody(size, &s.bodies)
	}
	if endOfStream {
		s.chargeBody()
	}
	return proxywasm.Continue
}

// isEventStream reports whether a content type is text/event-stream,
// parameters aside, in any case (media types are case-insensitive).
func isEventStream(contentType string) bool {
	const es = "text/event-stream"
	return len(contentType) >= len(es) && strings.EqualFold(contentType[:len(es)], es) &&
		(len(contentType) == len(es) || contentType[len(es)] == ';' || contentType[len(es)] == ' ')
}

// chargeBody charges the limits whose cost was in the body, what it said,
// with the others; at the body's end, or at the stream's when it ended
// first (a response cut short, or ended by trailers).
func (s *Stream) chargeBody() {
	for i := range s.bodies {
		b := &s.bodies[i]
		l := &s.plan.Limits[b.limit]
		n, said := b.cost.Cost()
		if !said {
			s.p.host.IncCounter(s.p.m.bodyUnread)
		}
		l.Charge = l.OnResponse.Charge(s.status, n, said, l.Spec.Cost)
	}
	s.bodies = s.bodies[:0]
	s.charge()
}

// charge sends the check that charges s's limits charged after the
// response what they cost (PlannedLimit.Charge); nothing when it is
// nothing for each.
func (s *Stream) charge() {
	p, h := s.p, s.p.host
	n := 0
	for i := range s.plan.Limits {
		if l := &s.plan.Limits[i]; l.OnResponse != nil && l.Charge > 0 {
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
	p.charges.Put(id, struct{}{})
}

// chargeResponse handles the bridge's answer to a charge; false when
// calloutID is not one.
func (p *Plugin) chargeResponse(calloutID uint32, numHeaders, bodySize int) bool {
	if p.charges.Ref(calloutID) == nil {
		return false
	}
	p.charges.Delete(calloutID)
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
	b := appendEventStart(p.event[:0], "charge_error", p.host.NowNanos()/1e6)
	b = append(b, `,"reason":`...)
	b = rules.AppendJSONString(b, reason)
	b = append(b, '}')
	p.event = b
	p.host.Log(proxywasm.LogLevelWarn, b)
}
