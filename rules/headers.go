package rules

import "strconv"

func (h *HeaderConfig) compile() {
	h.limitName = h.Prefix + "Limit"
	h.remainingName = h.Prefix + "Remaining"
	h.resetName = h.Prefix + "Reset"
	h.strategyName = h.Prefix + "Strategy"
	h.delayName = h.Prefix + "Delay"
}

// maxResponseHeaders is the most headers Render and AddDelay write.
const maxResponseHeaders = 8

// ResponseHeaders is a fixed set of rendered headers. Values point into
// buf, so rendering reuses one ResponseHeaders per request without
// allocating. Valid until the next Render.
type ResponseHeaders struct {
	Names  [maxResponseHeaders]string
	Values [maxResponseHeaders][]byte
	N      int
	buf    [384]byte
	used   int
}

// Reset empties h.
func (h *ResponseHeaders) Reset() { h.N, h.used = 0, 0 }

func (h *ResponseHeaders) add(name string, value func([]byte) []byte) {
	start := h.used
	out := value(h.buf[start:start:len(h.buf)])
	if len(out) > len(h.buf)-start || h.N == maxResponseHeaders {
		return // cannot happen with the bounded values Render writes
	}
	h.used += len(out)
	h.Names[h.N] = name
	h.Values[h.N] = h.buf[start:h.used:h.used]
	h.N++
}

// Headline picks the decision the response headers describe: the denying
// enforced limit that makes the client wait longest, or, when everything
// passed, the enforced limit with the least remaining. log_only limits
// never show. Returns -1 when no enforced limit applies.
func Headline(limits []PlannedLimit, decisions []Decision) int {
	best := -1
	for i := range decisions {
		if i >= len(limits) || limits[i].Action == LogOnly {
			continue
		}
		d := &decisions[i]
		if best < 0 {
			best = i
			continue
		}
		b := &decisions[best]
		switch {
		case !d.Allowed && b.Allowed:
			best = i
		case !d.Allowed && !b.Allowed:
			if d.RetryAfterMS > b.RetryAfterMS {
				best = i
			}
		case d.Allowed && b.Allowed:
			if d.Remaining < b.Remaining || d.Remaining == b.Remaining && d.Limit < b.Limit {
				best = i
			}
		}
	}
	return best
}

// Render writes the rate limit headers for decision d of limit l into out.
// nowMS is the current time; denied adds Retry-After.
func (h *HeaderConfig) Render(out *ResponseHeaders, l *PlannedLimit, d *Decision, nowMS int64, denied bool) {
	out.Reset()
	if h.Disabled {
		return
	}
	resetSec := ceilSeconds(d.ResetMS)
	remaining := max(d.Remaining, 0)
	out.add(h.limitName, func(b []byte) []byte { return strconv.AppendInt(b, d.Limit, 10) })
	out.add(h.remainingName, func(b []byte) []byte { return strconv.AppendInt(b, remaining, 10) })
	out.add(h.resetName, func(b []byte) []byte { return strconv.AppendInt(b, resetSec, 10) })
	if h.Strategy {
		out.add(h.strategyName, func(b []byte) []byte { return append(b, l.Spec.Algorithm.String()...) })
	}
	retry := RetryAfterSeconds(d, nowMS)
	if denied && h.RetryAfter {
		out.add("Retry-After", func(b []byte) []byte { return strconv.AppendInt(b, retry, 10) })
	}
	if h.Draft {
		// draft-ietf-httpapi-ratelimit-headers-11 structured fields.
		out.add("RateLimit-Policy", func(b []byte) []byte {
			b = appendSFString(b, l.Rule)
			b = append(b, ";q="...)
			b = strconv.AppendInt(b, d.Limit, 10)
			b = append(b, ";w="...)
			return strconv.AppendInt(b, ceilSeconds(l.Spec.WindowMS), 10)
		})
		out.add("RateLimit", func(b []byte) []byte {
			b = appendSFString(b, l.Rule)
			b = append(b, ";r="...)
			b = strconv.AppendInt(b, remaining, 10)
			b = append(b, ";t="...)
			t := max(ceilSeconds(d.ResetMS-nowMS), 0)
			if denied {
				t = retry
			}
			return strconv.AppendInt(b, t, 10)
		})
	}
}

// AddDelay adds to out the header that tells a client its request was
// held delayMS milliseconds by a throttle limit (X-RateLimit-Delay).
func (h *HeaderConfig) AddDelay(out *ResponseHeaders, delayMS int64) {
	if h.Disabled {
		return
	}
	out.add(h.delayName, func(b []byte) []byte { return strconv.AppendInt(b, delayMS, 10) })
}

// RetryAfterSeconds is the Retry-After value for a denial: whole seconds,
// rounded up, at least 1 so clients never retry in a tight loop.
func RetryAfterSeconds(d *Decision, nowMS int64) int64 {
	ms := d.RetryAfterMS
	if ms <= 0 {
		ms = d.ResetMS - nowMS
	}
	return max(ceilSeconds(ms), 1)
}

// ceilSeconds rounds milliseconds up to whole seconds (down for negative
// values, which only occur for a reset in the past).
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return ms / 1000
	}
	return (ms + 999) / 1000
}

// appendSFString writes a structured-field string; names are [a-z0-9_.:-].
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// AppendDenyBody appends the 429 JSON body in the error envelope of the
// bridge's REST API, so clients parse one error shape everywhere; details
// name the rule whose limit denied.
func (c *Config) AppendDenyBody(dst []byte, l *PlannedLimit, d *Decision, nowMS int64, requestID string) []byte {
	return AppendDenyBodyEnd(c.AppendDenyBodyStart(dst, l, d, nowMS), requestID)
}

// AppendDenyBodyStart appends the 429 body up to the request id, which is
// all of it that does not change from one request to the next: a proxy
// refusing a key many times keeps it and adds AppendDenyBodyEnd.
func (c *Config) AppendDenyBodyStart(dst []byte, l *PlannedLimit, d *Decision, nowMS int64) []byte {
	dst = append(dst, `{"error":{"code":"RATE_LIMITED","message":`...)
	if c.Deny.Message != "" {
		dst = AppendJSONString(dst, c.Deny.Message)
	} else {
		dst = append(dst, `"Rate limit exceeded: `...)
		dst = strconv.AppendInt(dst, d.Limit, 10)
		dst = append(dst, " requests per "...)
		dst = l.Spec.AppendWindow(dst)
		dst = append(dst, ` allowed."`...)
	}
	dst = append(dst, `,"details":{"limit":`...)
	dst = strconv.AppendInt(dst, d.Limit, 10)
	dst = append(dst, `,"remaining":0,"reset_at":`...)
	dst = strconv.AppendInt(dst, ceilSeconds(d.ResetMS), 10)
	dst = append(dst, `,"retry_after":`...)
	dst = strconv.AppendInt(dst, RetryAfterSeconds(d, nowMS), 10)
	dst = append(dst, `,"rule":`...)
	dst = AppendJSONString(dst, l.Rule)
	return append(dst, `},"request_id":`...)
}

// AppendDenyBodyEnd finishes a body AppendDenyBodyStart began.
func AppendDenyBodyEnd(dst []byte, requestID string) []byte {
	dst = AppendJSONString(dst, requestID)
	return append(dst, "}}"...)
}

// AppendUnavailableBody appends the fail_closed answer's body.
func AppendUnavailableBody(dst []byte, reason, requestID string) []byte {
	dst = append(dst, `{"error":{"code":"SERVICE_UNAVAILABLE","message":"Rate limiter unavailable; request refused (fail_closed).","details":{"reason":`...)
	dst = AppendJSONString(dst, reason)
	dst = append(dst, `},"request_id":`...)
	dst = AppendJSONString(dst, requestID)
	return append(dst, "}}"...)
}
