package filter

import (
	"net/netip"

	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Events are one JSON line per blocked request (info), per bridge failure
// (warn) and, when the host logs at debug, per allowed request (debug):
// when, who (user, IP), where (endpoint), the count against the limit and
// its reset, plus what an operator needs to find the request and its cause:
// request id, rule, action (docs/config.md, "Metrics and events").

func (s *Stream) eventHead(b []byte, typ string) []byte {
	return appendEventHead(b, typ, s.nowMS, bytesString(s.requestID), s.plan.Endpoint, s.plan.Identity.User, s.clientIP())
}

// appendEventHead writes what every event starts with: when, what, which
// request, where and who.
func appendEventHead(b []byte, typ string, nowMS int64, requestID, endpoint, user string, ip netip.Addr) []byte {
	b = appendEventStart(b, typ, nowMS)
	b = append(b, `,"request_id":`...)
	b = rules.AppendJSONString(b, requestID)
	b = append(b, `,"endpoint":`...)
	b = rules.AppendJSONString(b, endpoint)
	b = append(b, `,"user_id":`...)
	b = rules.AppendJSONString(b, user)
	b = append(b, `,"ip_address":"`...)
	if ip.IsValid() {
		b = ip.AppendTo(b) // digits, dots, colons: nothing to escape
	}
	return append(b, '"')
}

// appendEventStart writes when and what, for an event of no request.
func appendEventStart(b []byte, typ string, nowMS int64) []byte {
	b = append(b, `{"timestamp":"`...)
	b = appendTimestamp(b, nowMS)
	b = append(b, `","event_type":"`...)
	b = append(b, typ...)
	return append(b, '"')
}

func (s *Stream) event(level proxywasm.LogLevel, typ string, i int, d *rules.Decision, action string) {
	l := &s.plan.Limits[i]
	b := s.eventHead(s.p.event[:0], typ)
	b = append(b, `,"rule":"`...)
	b = append(b, l.Rule...) // a validated name: nothing to escape
	b = append(b, `","action":"`...)
	b = append(b, action...)
	b = append(b, `","request_count":`...)
	b = itoa(b, d.Limit-max(d.Remaining, 0))
	b = append(b, `,"limit":`...)
	b = itoa(b, d.Limit)
	b = append(b, `,"window_reset":`...)
	b = itoa(b, (d.ResetMS+999)/1000)
	if !d.Allowed {
		b = append(b, `,"retry_after":`...)
		b = itoa(b, rules.RetryAfterSeconds(d, s.nowMS))
	}
	b = append(b, '}')
	s.p.event = b
	s.p.host.Log(level, b)
}

func (s *Stream) backendError(reason string) {
	b := s.eventHead(s.p.event[:0], "backend_error")
	b = append(b, `,"reason":`...)
	b = rules.AppendJSONString(b, reason)
	b = append(b, `,"failure_mode":"`...)
	b = append(b, s.cfg.FailureMode.String()...)
	b = append(b, `"}`...)
	s.p.event = b
	s.p.host.Log(proxywasm.LogLevelWarn, b)
}

// appendTimestamp writes Unix ms as RFC 3339 UTC with milliseconds. It is
// the civil-from-days algorithm: several times cheaper than time.Format,
// which matters because it runs for every blocked request.
func appendTimestamp(b []byte, ms int64) []byte {
	if ms < 0 {
		ms = 0
	}
	days, rem := ms/86_400_000, ms%86_400_000
	z := days + 719468
	era := z / 146097
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y := yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d := doy - (153*mp+2)/5 + 1
	m := mp + 3
	if m > 12 {
		m -= 12
		y++
	}
	b = pad(b, y, 4)
	b = pad(append(b, '-'), m, 2)
	b = pad(append(b, '-'), d, 2)
	b = pad(append(b, 'T'), rem/3_600_000, 2)
	b = pad(append(b, ':'), rem/60_000%60, 2)
	b = pad(append(b, ':'), rem/1000%60, 2)
	b = pad(append(b, '.'), rem%1000, 3)
	return append(b, 'Z')
}

func pad(b []byte, n int64, width int) []byte {
	var tmp [20]byte
	i := len(tmp)
	for n > 0 || width > 0 {
		i--
		tmp[i] = byte('0' + n%10)
		n /= 10
		width--
	}
	return append(b, tmp[i:]...)
}
