package filter

import (
	"container/heap"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Throttle limits (docs/config.md, throttle). The bridge reserves the
// request's slot in the check that decides it and answers "allowed after
// D"; the stream stays paused, and the root context's tick resumes it once
// D has passed (proxy_set_effective_context, then proxy_continue_stream).
// The tick is set to fire when the next held request is due, and back to
// its usual period when none is held.
//
// A VM holds at most throttle.max_waiting requests. A place is taken when
// the check is sent, so that the answers of the checks in flight never
// overfill it; a request that finds every place taken is checked as one
// that cannot wait (max_delay_ms 0): it passes if it can at once, and is
// refused, consuming nothing, if it cannot. A held request whose client
// goes away frees its place; its slot at the bridge stays taken.

// throttleState is what a VM knows of the requests it holds.
type throttleState struct {
	held   heldStreams // held requests, the one due first at 0
	places int64       // held requests and checks in flight that may come back held
	// The root's tick: its period as last set, when it fires next, and
	// when the work done once a period (OnTick) runs next; proxy clock, ms.
	period uint32
	next   int64
	slowAt int64
}

// prepareThrottle takes a place for s when one of its limits throttles,
// or, with every place taken, makes its throttle limits refuse a wait.
func (s *Stream) prepareThrottle() {
	p := s.p
	s.noWait = false
	throttles := false
	for i := range s.plan.Limits {
		if s.plan.Limits[i].Action == rules.Throttle {
			throttles = true
			break
		}
	}
	if !throttles {
		return
	}
	if p.thr.places < s.cfg.Throttle.MaxWaiting {
		p.thr.places++
		s.holdsPlace = true
		return
	}
	s.noWait = true
	for i := range s.plan.Limits {
		if l := &s.plan.Limits[i]; l.Action == rules.Throttle {
			l.MaxDelayMS = 0
		}
	}
}

// releasePlace gives back the place s holds, if any.
func (s *Stream) releasePlace() {
	if s.holdsPlace {
		s.holdsPlace = false
		s.p.thr.places--
	}
}

// hold keeps s paused until delayMS from now; its response will say so.
func (s *Stream) hold(best int, delayMS int64) {
	p, h := s.p, s.p.host
	now := h.NowNanos() / 1e6
	s.state = stateHeld
	s.dueMS = now + delayMS
	s.delayMS = delayMS
	if !s.holdsPlace { // cannot happen: a check without a place asks for no wait
		p.thr.places++
		s.holdsPlace = true
	}
	p.push(s)
	h.IncCounter(p.m.throttled)
	h.AddCounter(p.m.throttleDelayMS, delayMS)
	h.Record(p.m.throttleDelay, delayMS)
	h.AddGauge(p.m.throttleWaiting, 1)
	if best >= 0 {
		s.throttledEvent(best, delayMS)
	}
	if s.dueMS < p.thr.next {
		p.setTick(now, uint32(max(1, delayMS)))
	}
}

// throttleTick resumes the held requests that are due and sets the tick
// for the next one.
func (p *Plugin) throttleTick(now int64) {
	resumed := false
	for len(p.thr.held) > 0 && p.thr.held[0].dueMS <= now {
		s := p.pop()
		s.releasePlace()
		p.host.AddGauge(p.m.throttleWaiting, -1)
		p.host.SetEffectiveContext(s.id)
		s.state, s.answered = stateDone, true
		p.host.ResumeRequest()
		resumed = true
	}
	if resumed {
		p.host.SetEffectiveContext(p.id)
	}
}

// setTick sets the root's tick period to period ms at now.
func (p *Plugin) setTick(now int64, period uint32) {
	p.thr.period, p.thr.next = period, now+int64(period)
	p.host.SetTickPeriod(period)
}

// scheduleTick sets the tick to fire when the next held request is due or
// the work of the next period is, whichever comes first.
func (p *Plugin) scheduleTick(now int64) {
	at := p.thr.slowAt
	if len(p.thr.held) > 0 {
		at = min(at, p.thr.held[0].dueMS)
	}
	period := uint32(max(1, at-now))
	if period != p.thr.period {
		p.setTick(now, period)
	} else {
		p.thr.next = now + int64(period)
	}
}

// unhold drops s from the held requests: its client went away.
func (p *Plugin) unhold(s *Stream) {
	p.remove(s)
	s.releasePlace()
	p.host.AddGauge(p.m.throttleWaiting, -1)
}

// throttledEvent logs that the request is held for delayMS by limit i.
func (s *Stream) throttledEvent(i int, delayMS int64) {
	l, d := &s.plan.Limits[i], &s.resp.Decisions[i]
	b := s.eventHead(s.p.event[:0], "throttled")
	b = append(b, `,"rule":"`...)
	b = append(b, l.Rule...) // a validated name: nothing to escape
	b = append(b, `","action":"throttle","delay_ms":`...)
	b = itoa(b, delayMS)
	b = append(b, `,"limit":`...)
	b = itoa(b, d.Limit)
	b = append(b, `,"window_reset":`...)
	b = itoa(b, (d.ResetMS+999)/1000)
	b = append(b, '}')
	s.p.event = b
	s.p.host.Log(proxywasm.LogLevelInfo, b)
}

// heldStreams are the held requests, a container/heap by due time; each
// stream knows its index, so one that ends is removed at once.
type heldStreams []*Stream

func (h heldStreams) Len() int           { return len(h) }
func (h heldStreams) Less(i, j int) bool { return h[i].dueMS < h[j].dueMS }
func (h heldStreams) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heldAt, h[j].heldAt = i, j
}

func (h *heldStreams) Push(x any) {
	s := x.(*Stream)
	s.heldAt = len(*h)
	*h = append(*h, s)
}

func (h *heldStreams) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.heldAt = -1
	return s
}

func (p *Plugin) push(s *Stream) { heap.Push(&p.thr.held, s) }
func (p *Plugin) pop() *Stream   { return heap.Pop(&p.thr.held).(*Stream) }

func (p *Plugin) remove(s *Stream) {
	if s.heldAt >= 0 {
		heap.Remove(&p.thr.held, s.heldAt)
	}
}
