package filter

import (
	"net/netip"
	"unicode/utf8"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

type streamState uint8

const (
	stateNew     streamState = iota
	stateWaiting             // paused, call-out in flight
	stateHeld                // paused until its throttle slot (throttle.go)
	stateDone                // decided
)

// Stream is one HTTP request. Streams are recycled, so every buffer here is
// reused across requests.
type Stream struct {
	p     *Plugin
	id    uint32
	cfg   *rules.Config // the config the request started under
	state streamState
	// callID: the call-out the stream waits for, in stateWaiting.
	callID uint32
	// answered: the host was told what to do with the request (a local
	// response, or resume); nothing may answer it again.
	answered bool
	// testPanicInCallout: the request asked for a panic while its bridge
	// answer is handled (see testPanicHeader).
	testPanicInCallout bool

	req         rules.Request
	plan        rules.Plan
	resp        rules.CheckResponse
	respHeaders rules.ResponseHeaders
	nowMS       int64

	// Copies of what outlives the request-headers callback (host views don't).
	user      []byte
	endpoint  []byte
	requestID []byte

	body     []byte      // check request
	callHdrs [][2]string // call-out headers
	pairs    [][2]string // local response headers,
	local    []byte      // serialized
	leases   []streamLease

	// Throttle (throttle.go): the request holds a place among the VM's
	// held requests; it was checked as one that cannot wait (every place
	// was taken); while held, when it is due, for how long, and its
	// index among the held.
	holdsPlace, noWait bool
	dueMS, delayMS     int64
	heldAt             int
	// charges: the request was let through with limits charged after
	// its response (charge.go); once its headers are in, its status, and
	// the limits whose cost its body says.
	charges bool
	status  int
	bodies  bodyCosts
}

// OnRequestHeaders decides what happens to the request.
func (s *Stream) OnRequestHeaders(int, bool) proxywasm.Action {
	p, h := s.p, s.p.host
	if s.cfg == nil || !s.cfg.Enabled {
		// Never configured (the host refused every config), or disabled:
		// nothing of the request is read.
		h.IncCounter(p.m.requests)
		h.SkipResponseHeaders(s.id)
		return proxywasm.Continue
	}
	if p.testPanics {
		switch p.headers.Header(testPanicHeader) {
		case "request":
			h.IncCounter(p.m.requests)
			panic("sluice: test panic in proxy_on_request_headers")
		case "callout":
			s.testPanicInCallout = true
		}
	}
	// Most requests of a proxy may be ones no limit applies to (health
	// checks, static files). While recent ones mostly were, a request's
	// path alone, one host call, rules it out before the rest of its
	// headers are read; while they mostly were not, that call would come
	// on top of reading them, and is not made.
	if p.unmatched > pathFirstShare && !s.cfg.MayApply(h.RequestPath()) {
		p.unlimited++
		p.notePathFirst(true)
		h.SkipResponseHeaders(s.id)
		return proxywasm.Continue
	}
	// The peer address and the time are asked for only when a limit
	// applies (rules.LazyFields): most requests of a proxy may match none.
	s.nowMS = 0
	method, path, host := h.RequestPseudoHeaders()
	s.req = rules.Request{
		Method:  method,
		Path:    path,
		Host:    host,
		Headers: p.headers,
		Lazy:    s,
		Tokens:  p.tokens,
	}
	cached := false
	if kept, tag, ok := p.plans.Lookup(s.cfg, &s.req); ok {
		if s.refuseAgain(kept, tag) {
			p.notePathFirst(false)
			return proxywasm.Pause // counted by the next tick
		}
		s.plan.CopyFrom(kept)
		cached = true
	} else {
		p.plans.Evaluate(s.cfg, &s.req, &s.plan)
	}
	unlimited := !s.plan.Exempt && len(s.plan.Limits) == 0
	p.notePathFirst(unlimited)
	if unlimited {
		p.unlimited++
	} else {
		h.IncCounter(p.m.requests)
	}
	if s.plan.Exempt {
		h.IncCounter(p.m.exempt)
	}
	if s.plan.Exempt || len(s.plan.Limits) == 0 {
		h.SkipResponseHeaders(s.id) // nothing to add to the response
		return proxywasm.Continue
	}
	kept := cached
	if !cached {
		// A client's next request most likely reads the same: it gets
		// this plan without evaluating. Kept before the limits change.
		kept = p.plans.KeepRepeated(s.cfg, &s.req, &s.plan, noRefusal)
	}
	s.now()
	s.keepRequestID()
	if leasable(s.plan.Limits) && s.answerFromLeases() {
		return proxywasm.Continue
	}
	if s.cfg.LocalCache.Enabled {
		if i, d, hold, hash, memo, ok := p.cachedDenial(s, false); ok {
			s.refuseCached(i, &d, hold, hash, memo)
			if kept {
				p.plans.Retag(p.refusalTag(hash, i))
			} else {
				p.plans.Keep(s.cfg, &s.req, &s.plan, p.refusalTag(hash, i))
			}
			return proxywasm.Pause
		}
	}
	s.keepIdentity() // the answer comes after this callback
	if readsBody(s.plan.Limits) {
		// A compressed answer cannot be read for its cost: asking for one
		// would let a client pay the rule's cost, not its answer's.
		h.RemoveRequestHeader("accept-encoding")
	}
	s.prepareLeases()
	s.prepareThrottle()
	rid, user, endpoint := bytesString(s.requestID), bytesString(s.user), bytesString(s.endpoint)
	if body, ok := p.plans.AppendKeptCheck(s.body[:0], rid, user, endpoint, s.plan.Limits); ok {
		s.body = body
	} else {
		s.body = rules.AppendCheckRequest(s.body[:0], rid, user, endpoint, s.plan.Limits)
	}
	b := &s.cfg.Bridge
	s.callHdrs = p.appendCallHeaders(s.callHdrs[:0], b, rid)
	callID, err := h.Dispatch(b.Cluster, s.callHdrs, s.body, b.TimeoutMS)
	if err != nil {
		s.fail("dispatch failed: " + err.Error())
		if s.answered {
			return proxywasm.Pause // answered with a local 503 or 429
		}
		return proxywasm.Continue
	}
	p.pending.Put(callID, s)
	s.state, s.callID = stateWaiting, callID
	return proxywasm.Pause
}

// Plugin.unmatched is in 1/shareOne. Looking at the path first pays when
// more than about a quarter of requests are ones no limit applies to: it
// saves each of those reading and indexing the rest of its headers, and
// costs every other request a host call and a path match more.
const (
	shareOne       = 1 << 16
	pathFirstShare = shareOne / 4
)

// notePathFirst counts a request into Plugin.unmatched: none, when no
// limit applied to it.
func (p *Plugin) notePathFirst(none bool) {
	x := 0
	if none {
		x = shareOne
	}
	p.unmatched += (x - p.unmatched) / 32
}

// Source, NowUnix and PeerName give rules.Evaluate the peer address, the
// time and the client certificate's name when it needs them
// (rules.LazyFields).
func (s *Stream) Source() string { return s.p.host.Property("source.address") }
func (s *Stream) NowUnix() int64 { return s.now() / 1000 }
func (s *Stream) PeerName(dns bool) string {
	if dns {
		return s.p.host.Property("connection.dns_san_peer_certificate")
	}
	return s.p.host.Property("connection.uri_san_peer_certificate")
}

// now returns the request's time in Unix ms, asking the host once.
func (s *Stream) now() int64 {
	if s.nowMS == 0 {
		s.nowMS = s.p.host.NowNanos() / 1e6
	}
	return s.nowMS
}

// clientIP is the request's client address. Evaluate works it out only
// when a key or an exemption needs it, so it may be worked out here on
// first use, which must come while the request's headers and properties
// can be read: in its headers callback, or while it is paused, with its
// stream the effective context (the bridge's answer; Envoy's
// Context::getMap gives the request headers until the request continues).
// Only an event needs it there, so an allowed request does without.
func (s *Stream) clientIP() netip.Addr { return s.cfg.ResolveClientIP(&s.req, &s.plan) }

// keepIdentity copies the identity out of host memory, which is only valid
// during this callback, into the stream's own buffers, for a request
// answered after it. One answered during the callback reads the plan's
// views of host memory. Not inlined: a function's frame is set up, in part
// zeroed, on every call, and in WebAssembly that is dear; OnRequestHeaders
// would pay for these copies on requests that never make them.
//
//go:noinline
func (s *Stream) keepIdentity() {
	s.user = append(s.user[:0], s.plan.Identity.User...)
	s.endpoint = append(s.endpoint[:0], s.plan.Endpoint...)
	// From now on the plan refers to the copies.
	s.plan.Identity.User = bytesString(s.user)
	s.plan.Endpoint = bytesString(s.endpoint)
}

// keepRequestID copies the request's id, which every answer shows.
func (s *Stream) keepRequestID() { s.requestID = append(s.requestID[:0], s.requestIDView()...) }

// requestIDView is the request's id, a view valid during the request's
// headers callback: its x-request-id, else the host's request.id, cut to
// rules.MaxRequestIDLen.
func (s *Stream) requestIDView() string {
	rid := s.p.headers.Header("x-request-id")
	if rid == "" {
		rid = s.p.host.Property("request.id")
	}
	if len(rid) > rules.MaxRequestIDLen {
		// Cut at a character boundary, so a valid id stays valid UTF-8.
		n := rules.MaxRequestIDLen
		for n > 0 && !utf8.RuneStart(rid[n]) {
			n--
		}
		rid = rid[:n]
	}
	return rid
}

// OnHTTPCallResponse delivers the bridge's answer to the waiting stream.
func (p *Plugin) OnHTTPCallResponse(calloutID uint32, numHeaders, bodySize, _ int) {
	if p.policy.inFlight && calloutID == p.policy.callID {
		p.onPolicyResponse(numHeaders, bodySize)
		return
	}
	if p.chargeResponse(calloutID, numHeaders, bodySize) {
		return
	}
	if p.leaseCallResponse(calloutID, numHeaders, bodySize) {
		return
	}
	w := p.pending.Ref(calloutID)
	if w == nil {
		return // the stream ended before the answer came
	}
	s := *w
	p.pending.Delete(calloutID)
	p.host.SetEffectiveContext(s.id)
	s.state = stateDone
	p.answering = s
	s.answer(numHeaders, bodySize)
	p.answering = nil
}

// answer acts on the bridge's answer to s's call-out.
func (s *Stream) answer(numHeaders, bodySize int) {
	p := s.p
	if s.testPanicInCallout {
		panic("sluice: test panic in proxy_on_http_call_response")
	}
	if numHeaders == 0 {
		s.fail("bridge unreachable or timed out")
		s.finishFailure()
		return
	}
	status, body := p.host.CallResponse(bodySize)
	if status != "200" {
		s.fail("bridge answered status " + status)
		s.finishFailure()
		return
	}
	if err := rules.DecodeCheckResponse(body, len(s.plan.Limits), &s.resp); err != nil {
		s.fail(err.Error())
		s.finishFailure()
		return
	}
	s.decide()
}

// decide acts on a bridge answer.
func (s *Stream) decide() {
	p, h := s.p, s.p.host
	s.settleLeases(true)
	limits, decs := s.plan.Limits, s.resp.Decisions
	now := s.resp.NowMS
	if now == 0 {
		now = s.nowMS
	}
	for i := range decs {
		d := &decs[i]
		if d.Allowed {
			continue
		}
		if limits[i].Action == rules.LogOnly {
			h.IncCounter(p.m.logOnlyDenied)
			s.event(proxywasm.LogLevelInfo, "blocked", i, d, "log_only")
			continue
		}
		// A throttle limit checked as unable to wait was told less than
		// it may wait: its refusal is no rule for others.
		if s.cfg.LocalCache.Enabled && !(s.noWait && limits[i].Action == rules.Throttle) {
			p.cacheDenial(s.cfg, limits[i].Key, d, now)
		}
	}
	best := rules.Headline(limits, decs)
	delay := s.resp.DelayMS
	if !s.resp.Allowed || delay == 0 {
		s.releasePlace()
	}
	if !s.resp.Allowed && best >= 0 {
		if limits[best].Action == rules.Throttle {
			if s.noWait {
				h.IncCounter(p.m.throttleFull)
			} else {
				h.IncCounter(p.m.throttleTooLong)
			}
		}
		s.nowMS = now
		s.deny(best, &decs[best])
		return
	}
	h.IncCounter(p.m.allowed)
	s.charges = chargedAfter(limits)
	if best >= 0 {
		s.cfg.Headers.Render(&s.respHeaders, &limits[best], &decs[best], now, false)
		if delay > 0 {
			s.cfg.Headers.AddDelay(&s.respHeaders, delay)
		}
		if p.debug {
			s.event(proxywasm.LogLevelDebug, "allowed", best, &decs[best], "allow")
		}
	}
	if delay > 0 {
		s.hold(best, delay)
		return
	}
	s.answered = true
	h.ResumeRequest()
}

// deny answers the request with the configured 429, headers and body.
func (s *Stream) deny(i int, d *rules.Decision) {
	p, h := s.p, s.p.host
	s.state = stateDone
	h.IncCounter(p.m.denied)
	l := &s.plan.Limits[i]
	s.cfg.Headers.Render(&s.respHeaders, l, d, s.nowMS, true)
	s.local = s.appendLocalHeaders(s.local[:0])
	s.body = s.cfg.AppendDenyBody(s.body[:0], l, d, s.nowMS, bytesString(s.requestID))
	s.event(proxywasm.LogLevelInfo, "blocked", i, d, l.Action.String())
	s.respHeaders.Reset() // the local response already carries them
	s.sendLocal(s.cfg.Deny.Status, s.local, s.body)
}

// sendLocal answers the request with a local response.
func (s *Stream) sendLocal(status uint32, headers, body []byte) {
	s.answered = true
	s.p.host.SendLocalResponse(s.id, status, headers, body)
}

// fail records a bridge failure: counted and logged.
func (s *Stream) fail(reason string) {
	s.settleLeases(false)
	s.releasePlace()
	s.p.host.IncCounter(s.p.m.bridgeErrors)
	s.backendError(reason)
	// A denial the cache holds past its hold (the bridge was asked again
	// for it) still refuses until its retry time.
	if s.cfg.LocalCache.Enabled {
		if i, d, hold, hash, memo, ok := s.p.cachedDenial(s, true); ok {
			s.refuseCached(i, &d, hold, hash, memo)
			return
		}
	}
	if s.cfg.FailureMode == rules.FailClosed {
		s.state = stateDone
		s.p.host.IncCounter(s.p.m.failClosed)
		s.body = rules.AppendUnavailableBody(s.body[:0], reason, bytesString(s.requestID))
		s.sendLocal(s.cfg.Deny.FailClosedStatus, jsonHeaders, s.body)
		return
	}
	s.p.host.IncCounter(s.p.m.failOpen)
	// Let through without a limit's headers; charged after all when
	// its limits are (the bridge may be back by then).
	if s.charges = chargedAfter(s.plan.Limits); !s.charges {
		s.p.host.SkipResponseHeaders(s.id)
	}
}

// finishFailure resumes a paused request after fail_open.
func (s *Stream) finishFailure() {
	if s.cfg.FailureMode == rules.FailOpen && !s.answered {
		s.answered = true
		s.p.host.ResumeRequest()
	}
}

// OnResponseHeaders adds the rate limit headers of a request that passed,
// and charges its limits charged after the response.
func (s *Stream) OnResponseHeaders(_ int, endOfStream bool) proxywasm.Action {
	for i := 0; i < s.respHeaders.N; i++ {
		s.p.host.AddResponseHeader(s.respHeaders.Names[i], s.respHeaders.Values[i])
	}
	s.respHeaders.Reset()
	if s.charges {
		s.charges = false
		s.chargeHeaders(endOfStream)
	}
	return proxywasm.Continue
}

func (s *Stream) OnLog() {}

// OnDone recycles the stream; an answer still in flight is dropped, and a
// held request gives up its place (its slot at the bridge stays taken). A
// response whose body was to say what it cost is charged now, when its
// body did not end (cut short, or ended by trailers): what it said so far.
func (s *Stream) OnDone() {
	p := s.p
	if len(s.bodies) > 0 {
		s.chargeBody() // the body ended without its end of stream
	}
	p.forget(s)
	if s.state == stateHeld {
		p.unhold(s)
	}
	s.releasePlace()
	s.state = stateDone
	s.cfg = nil
	if len(p.free) < 1024 {
		p.free = append(p.free, s)
	}
}

// forget drops s's call-out still in flight, if any: its answer is ignored.
// Small enough to be inlined: every stream ends through it, and most have
// no call-out in flight.
func (p *Plugin) forget(s *Stream) {
	if s.state == stateWaiting {
		p.dropCall(s)
	}
}

func (p *Plugin) dropCall(s *Stream) {
	if w := p.pending.Ref(s.callID); w != nil && *w == s {
		p.pending.Delete(s.callID)
	}
}
