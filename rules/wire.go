package rules

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Wire format between plugin and bridge (docs/protocol.md). JSON, because
// both ends already carry a JSON parser and operators can read it in logs;
// encoders append to caller buffers so the plugin does not allocate.

// Bounds on check requests. They keep a hostile or buggy caller from making
// the bridge build huge keys or scripts.
const (
	MaxLimitsPerCheck = 64
	MaxRequestIDLen   = 128
	MaxKeyLen         = 512
	MaxRuleNameLen    = 64
	MaxLimitValue     = 1 << 40         // requests per window
	MaxWindowMS       = 366 * 86400_000 // one year
	MaxMultipliers    = 16
	MaxMultiplier     = 1 << 16
	MaxViolations     = 1000 // violations kept per key: bounds a penalty's memory
)

// LimitRequest is one limit of a check, as the bridge receives it.
type LimitRequest struct {
	Key     string // full counter key, hash tag included; the bridge appends suffixes only
	Rule    string
	Spec    LimitSpec // Spec.Lease set: the caller asks for a lease of the limit
	LogOnly bool      // its denial is logged and counted but does not deny the request
	// PerUser marks limits kept per client identity; overrides set through
	// the bridge's config API for (User, Endpoint) replace their Spec.
	PerUser bool
	Return  LeaseReturn // units of an earlier grant handed back, before the check is decided
	// Throttle: the limit's action is throttle. When it cannot take the
	// request now, the store reserves the request's slot up to MaxDelayMS
	// ahead (CheckResponse.DelayMS), or denies it consuming nothing.
	Throttle   bool
	MaxDelayMS int64
	// Fill: the limit takes what the check costs, or what it has left
	// when that is less, and allows while it has anything left (a cost of
	// 0 only asks whether it has). Its Decision.Remaining is what it had
	// before the check (Taken). Set by the bridge's rate limit service for
	// budgets and peeks, and on the wire ("fill") by the plugin for limits
	// charged after the response; never throttled or leased.
	Fill bool
	// Quota: one of the check's quota limits, which deny it only all
	// together: the check passes while any of them allows (and every
	// other enforced limit does), and those that deny take nothing. Set
	// by the bridge's rate limit service (quota_mode); never on the wire,
	// never throttled.
	Quota bool
}

// MaxDelay is the limit's max_delay_ms as the wire and the stores carry
// it: -1 when it is not throttled. A sliding window estimates its count,
// and a window of calendar months has no fixed length to reserve slots
// in, so neither ever is (a per-user override may have made a throttle
// limit one).
func (l *LimitRequest) MaxDelay() int64 {
	if !l.Throttle || l.Fill || l.Quota || l.Spec.Algorithm == SlidingWindow || l.Spec.Months > 0 {
		return -1
	}
	return l.MaxDelayMS
}

// InQuota tells whether l is one of its check's quota limits: marked
// Quota, and able to deny (a log-only limit denies nothing).
func (l *LimitRequest) InQuota() bool { return l.Quota && !l.LogOnly }

// Taken is what the limit took in a check that consumed it, from its
// decision d there: its cost, or a Fill limit's cost capped at what it had.
func (l *LimitRequest) Taken(d *Decision) int64 {
	if !d.Allowed {
		return 0
	}
	if l.Fill {
		return min(l.Spec.Cost, d.Remaining)
	}
	return l.Spec.Cost
}

// Op is what a check asks of the bridge.
type Op uint8

const (
	// OpDecide decides a request: its limits all-or-nothing, and grants
	// the leases it asks for when it is allowed.
	OpDecide Op = iota
	// OpRenew grants the leases asked for without a request: the limits
	// are decided at cost 0.
	OpRenew
	// OpReturn hands back the units of the limits' returns and consumes
	// nothing; its decisions are what the limits would decide.
	OpReturn
)

var opNames = [...]string{"", "renew", "return"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return ""
}

// CheckRequest carries every limit of one HTTP request. The bridge decides
// them together: when any enforced (not log_only) limit denies, nothing is
// consumed.
type CheckRequest struct {
	Op        Op
	RequestID string
	User      string // the client identity the per-user limits are kept for ("" if none)
	Endpoint  string // request path, for per-identity overrides
	Limits    []LimitRequest
}

// LeaseReturn hands back what a proxy did not spend of a grant.
type LeaseReturn struct {
	Tag     int64 // the grant's tag, as the bridge gave it
	Granted int64 // units the grant held
	Units   int64 // units not spent; 0: nothing is handed back
}

// LeaseGrant is the lease granted with a decision.
type LeaseGrant struct {
	Units int64 // 0: none
	TTLMS int64 // spend it within this long of the store's now_ms
	Tag   int64 // names the grant when its units are handed back
}

// Decision is the answer for one limit.
type Decision struct {
	Allowed      bool
	Limit        int64 // the limit (token bucket: burst capacity)
	Remaining    int64 // units left in the store, a lease granted with it deducted (LimitRequest.Fill: before)
	ResetMS      int64 // Unix ms when the limit is fully available again
	RetryAfterMS int64 // when denied: wait this long before the next attempt
	Lease        LeaseGrant
}

// CheckResponse answers a CheckRequest, one decision per limit in order.
type CheckResponse struct {
	Allowed bool  // every enforced (not log_only) decision allowed
	NowMS   int64 // the store's clock, so callers can age cache entries
	// DelayMS, when allowed: the request may pass this long after NowMS,
	// at the slot its throttle limits reserved; 0: at once.
	DelayMS   int64
	Decisions []Decision
}

// PlannedLimit is a limit that matched a request, as the plugin holds it.
// Key points into the plan's buffer and is valid until the next Evaluate.
type PlannedLimit struct {
	Key     []byte
	Rule    string     // the rule the limit comes from: a rule or category name, or "tier.<name>" / "tier.<name>.<override>"
	Spec    *LimitSpec // points into the Config
	Action  Action
	PerUser bool
	// MaxDelayMS: how long a throttle limit may hold the request. The
	// caller may lower it before encoding (0: the request cannot wait).
	MaxDelayMS int64
	// Set by the caller before encoding: ask for a lease of Spec.Lease,
	// and hand back the units of an earlier grant.
	AskLease bool
	Return   LeaseReturn
	// OnResponse: the limit is charged after the response (its rule's
	// on_response); a check only asks whether it has anything left, and
	// AppendChargeRequest charges it Charge, which the caller sets.
	OnResponse *OnResponse
	Charge     int64

	head *limitHead // the start of its encoding, from the config
}

// AppendCheckRequest encodes a check for limits and appends it to dst.
func AppendCheckRequest(dst []byte, requestID, user, endpoint string, limits []PlannedLimit) []byte {
	return appendCheckTail(appendCheckStart(dst, OpDecide, requestID), user, endpoint, limits)
}

// appendCheckTail appends what follows the request id in a check of
// limits: the same for every request of a plan, so a kept plan's is
// rendered once (PlanCache.AppendKeptCheck).
func appendCheckTail(dst []byte, user, endpoint string, limits []PlannedLimit) []byte {
	dst = appendCheckIdentity(dst, user, endpoint)
	for i := range limits {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendPlanned(dst, &limits[i])
	}
	return append(dst, "]}"...)
}

// sameEncoding tells whether a and b encode alike in a check
// (appendPlanned).
func sameEncoding(a, b *PlannedLimit) bool {
	return string(a.Key) == string(b.Key) && a.Rule == b.Rule && a.Spec == b.Spec && a.Action == b.Action &&
		a.PerUser == b.PerUser && a.MaxDelayMS == b.MaxDelayMS && a.AskLease == b.AskLease && a.Return == b.Return &&
		a.OnResponse == b.OnResponse && a.head == b.head
}

// AppendLeaseCall encodes a check of one limit that renews its lease or
// hands back the units of l.Return (op OpRenew or OpReturn).
func AppendLeaseCall(dst []byte, op Op, requestID string, l *PlannedLimit) []byte {
	dst = appendCheckHead(dst, op, requestID, "", "")
	return append(appendPlanned(dst, l), "]}"...)
}

// appendPlanned appends l as a check's limit. sameEncoding compares every
// field it reads.
func appendPlanned(dst []byte, l *PlannedLimit) []byte {
	if l.OnResponse != nil {
		// Asked whether it has anything left: a fill limit at cost 0.
		peek := peekOf(l.Spec)
		return appendLimit(dst, l.Key, l.head, l.Rule, &peek, l.Action == LogOnly, l.PerUser, true, -1, Lease{}, LeaseReturn{})
	}
	var lease Lease
	if l.AskLease {
		lease = l.Spec.Lease
	}
	maxDelay := int64(-1)
	if l.Action == Throttle {
		maxDelay = l.MaxDelayMS
	}
	return appendLimit(dst, l.Key, l.head, l.Rule, l.Spec, l.Action == LogOnly, l.PerUser, false, maxDelay, lease, l.Return)
}

// AppendChargeRequest encodes the check that charges the limits of a
// request that are charged after its response (OnResponse) what it cost
// (Charge, set by the caller; those at 0 are left out) and appends it to
// dst. Each is a fill limit: it takes its charge, or what it has left
// when that is less. Each is sent log_only, so that one with nothing left
// does not keep the others from being charged (a check is all-or-nothing
// over its enforced limits), and without its penalty: a charge that finds
// a limit spent is no violation, the request was let through.
func AppendChargeRequest(dst []byte, requestID, user, endpoint string, limits []PlannedLimit) []byte {
	dst = appendCheckHead(dst, OpDecide, requestID, user, endpoint)
	n := 0
	for i := range limits {
		l := &limits[i]
		if l.OnResponse == nil || l.Charge <= 0 {
			continue
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		charge := *l.Spec
		charge.Cost, charge.Penalty = l.Charge, nil
		dst = appendLimit(dst, l.Key, nil, l.Rule, &charge, true, l.PerUser, true, -1, Lease{}, LeaseReturn{})
	}
	return append(dst, "]}"...)
}

// AppendCheckRequestFrom encodes an already decoded request (bridge tests, tools).
func AppendCheckRequestFrom(dst []byte, req *CheckRequest) []byte {
	dst = appendCheckHead(dst, req.Op, req.RequestID, req.User, req.Endpoint)
	for i := range req.Limits {
		l := &req.Limits[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendLimit(dst, []byte(l.Key), nil, l.Rule, &l.Spec, l.LogOnly, l.PerUser, l.Fill, l.MaxDelay(), l.Spec.Lease, l.Return)
	}
	return append(dst, "]}"...)
}

// sendOverrideField reports whether a user or endpoint goes into a check.
// They only serve to look up overrides, which the bridge bounds at
// MaxKeyLen bytes and which are set through JSON, so as valid UTF-8. A
// longer value, or one that is not UTF-8 (it would arrive with U+FFFD in
// place of its bad bytes, and could match another client's override), is
// left out rather than have the bridge refuse the whole check: a long URL
// must still be counted, whatever the failure mode.
func sendOverrideField(s string) bool {
	return s != "" && len(s) <= MaxKeyLen && utf8.ValidString(s)
}

func appendCheckHead(dst []byte, op Op, requestID, user, endpoint string) []byte {
	return appendCheckIdentity(appendCheckStart(dst, op, requestID), user, endpoint)
}

// appendCheckStart appends a check's opening, its op and request id.
func appendCheckStart(dst []byte, op Op, requestID string) []byte {
	dst = append(dst, '{')
	if op != OpDecide {
		dst = append(dst, `"op":"`...)
		dst = append(dst, op.String()...)
		dst = append(dst, `",`...)
	}
	// The request id only serves the bridge's logs: one it would refuse,
	// or could not log as sent, is left out.
	if len(requestID) <= MaxRequestIDLen && utf8.ValidString(requestID) {
		dst = append(dst, `"request_id":`...)
		dst = AppendJSONString(dst, requestID)
		dst = append(dst, ',')
	}
	return dst
}

// appendCheckIdentity appends a check's user and endpoint, and opens its
// limits.
func appendCheckIdentity(dst []byte, user, endpoint string) []byte {
	if sendOverrideField(user) {
		dst = append(dst, `"user":`...)
		dst = AppendJSONString(dst, user)
		dst = append(dst, ',')
	}
	if sendOverrideField(endpoint) {
		dst = append(dst, `"endpoint":`...)
		dst = AppendJSONString(dst, endpoint)
		dst = append(dst, ',')
	}
	return append(dst, `"limits":[`...)
}

// appendLimit appends one limit; maxDelay < 0: not a throttle limit. head,
// when it fits the limit, is its start rendered before.
func appendLimit(dst, key []byte, head *limitHead, rule string, s *LimitSpec, logOnly, perUser, fill bool, maxDelay int64, lease Lease, ret LeaseReturn) []byte {
	dst = append(dst, `{"key":`...)
	dst = AppendJSONBytes(dst, key)
	if head.fits(rule, s, logOnly, perUser) {
		dst = append(dst, head.text...)
	} else {
		dst = appendLimitHead(dst, rule, s, logOnly, perUser)
	}
	if fill {
		dst = append(dst, `,"fill":true`...)
	}
	if maxDelay >= 0 {
		dst = appendInt(dst, `,"max_delay_ms":`, maxDelay)
	}
	if p := s.Penalty; p != nil && p.Enabled {
		dst = appendInt(dst, `,"penalty":{"detection_window_ms":`, p.DetectionWindowMS)
		dst = appendInt(dst, `,"violation_threshold":`, p.ViolationThreshold)
		dst = append(dst, `,"multipliers":[`...)
		for i, m := range p.Multipliers {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, m, 10)
		}
		dst = append(dst, "]}"...)
	}
	if lease.Size > 0 {
		dst = appendInt(dst, `,"lease":{"size":`, lease.Size)
		dst = append(appendInt(dst, `,"ttl_ms":`, lease.TTLMS), '}')
	}
	if ret.Units > 0 {
		dst = appendInt(dst, `,"lease_return":{"tag":`, ret.Tag)
		dst = appendInt(dst, `,"granted":`, ret.Granted)
		dst = append(appendInt(dst, `,"units":`, ret.Units), '}')
	}
	return append(dst, '}')
}

// appendLimitHead appends the fields of a limit from "rule" to
// "per_user": those that are the same on every check of a configured
// limit.
func appendLimitHead(dst []byte, rule string, s *LimitSpec, logOnly, perUser bool) []byte {
	dst = append(dst, `,"rule":`...)
	dst = AppendJSONString(dst, rule)
	dst = append(dst, `,"algorithm":"`...)
	dst = append(dst, s.Algorithm.String()...)
	dst = appendInt(dst, `","limit":`, s.Limit)
	if s.Months > 0 {
		// Not window_ms: a bridge that does not know calendar months
		// refuses the check rather than count an epoch-aligned window.
		dst = appendInt(dst, `,"window_months":`, s.Months)
	} else {
		dst = appendInt(dst, `,"window_ms":`, s.WindowMS)
	}
	dst = appendInt(dst, `,"burst":`, s.Burst)
	dst = appendInt(dst, `,"cost":`, s.Cost)
	if logOnly {
		dst = append(dst, `,"log_only":true`...)
	}
	if perUser {
		dst = append(dst, `,"per_user":true`...)
	}
	return dst
}

// limitHead is appendLimitHead's text for a configured limit, rendered
// when the configuration is parsed: on the proxy's wasm engines
// formatting those numbers and names again on every call-out was a good
// part of what the call-out cost the plugin. It is used only for a limit
// whose fields are still the ones it was rendered from.
type limitHead struct {
	rule             string
	alg              Algorithm
	limit, window    int64
	months           int64
	burst, cost      int64
	logOnly, perUser bool
	text             string
}

func newLimitHead(rule string, s *LimitSpec, logOnly, perUser bool) *limitHead {
	return &limitHead{rule: rule, alg: s.Algorithm, limit: s.Limit, window: s.WindowMS, months: s.Months, burst: s.Burst, cost: s.Cost,
		logOnly: logOnly, perUser: perUser, text: string(appendLimitHead(nil, rule, s, logOnly, perUser))}
}

// newPlannedHead is the head of a configured limit's checks: with onResp,
// of the check that asks it at cost 0 (appendPlanned).
func newPlannedHead(rule string, s *LimitSpec, logOnly, perUser bool, onResp *OnResponse) *limitHead {
	if onResp != nil {
		peek := peekOf(s)
		s = &peek
	}
	return newLimitHead(rule, s, logOnly, perUser)
}

// peekOf is s asked at cost 0: whether it has anything left.
func peekOf(s *LimitSpec) LimitSpec {
	peek := *s
	peek.Cost = 0
	return peek
}

// fits reports whether h renders these fields. The rule name must be the
// very string h was rendered for (comparing text would cost about what
// rendering it does); another one, even equal, is rendered anew.
func (h *limitHead) fits(rule string, s *LimitSpec, logOnly, perUser bool) bool {
	return h != nil && len(h.rule) == len(rule) && unsafe.StringData(h.rule) == unsafe.StringData(rule) &&
		h.alg == s.Algorithm && h.limit == s.Limit && h.window == s.WindowMS && h.months == s.Months && h.burst == s.Burst && h.cost == s.Cost &&
		h.logOnly == logOnly && h.perUser == perUser
}

// appendInt appends the literal lit and n in decimal.
func appendInt(dst []byte, lit string, n int64) []byte {
	return strconv.AppendInt(append(dst, lit...), n, 10)
}

// ErrInvalidCheck wraps every reason a check request is refused.
var ErrInvalidCheck = errors.New("invalid check request")

// DecodeCheckRequest parses and validates a check request from an untrusted
// caller. Errors name the field (limits[1].window_ms) and wrap ErrInvalidCheck.
// A check as the plugin encodes it is read in one pass
// (decodeCanonicalRequest); any other is read, or refused, by
// decodeRequestJSON, with the same result for the same check.
func DecodeCheckRequest(body []byte) (CheckRequest, error) {
	if req, ok := decodeCanonicalRequest(body); ok {
		return req, nil
	}
	return decodeRequestJSON(body)
}

// decodeRequestJSON reads any JSON rendering of a check. It walks each
// object once (ForEach) instead of looking every field up (Get scans the
// object per call); the first occurrence of a duplicated field wins, as
// with Get, and fields are validated in a fixed order so the first error
// reported does not depend on the field order in the body.
func decodeRequestJSON(body []byte) (CheckRequest, error) {
	var req CheckRequest
	if !gjson.ValidBytes(body) {
		return req, fmt.Errorf("%w: body is not valid JSON", ErrInvalidCheck)
	}
	// JSON text is UTF-8. gjson passes other bytes inside strings through,
	// and a rule name that is not UTF-8 cannot be a metric label or a log
	// field; the plugin's encoder never writes such bytes.
	if !utf8.Valid(body) {
		return req, fmt.Errorf("%w: body is not UTF-8", ErrInvalidCheck)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return req, fmt.Errorf("%w: body must be a JSON object", ErrInvalidCheck)
	}
	var op, id, user, endpoint, lims gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "op":
			firstField(&op, v)
		case "request_id":
			firstField(&id, v)
		case "user":
			firstField(&user, v)
		case "endpoint":
			firstField(&endpoint, v)
		case "limits":
			firstField(&lims, v)
		}
		return true
	})
	if err := decodeHead(op, id, user, endpoint, &req); err != nil {
		return req, err
	}
	if !lims.IsArray() {
		return req, fmt.Errorf("%w: limits: must be an array", ErrInvalidCheck)
	}
	// One pass decodes and counts; a wrong count wins over a bad element,
	// and the first bad element over later ones.
	var (
		n      int
		bad    error
		badIdx int
	)
	req.Limits = make([]LimitRequest, 0, 4) // most checks have 1 to 4 limits
	lims.ForEach(func(_, v gjson.Result) bool {
		n++
		if bad != nil || n > MaxLimitsPerCheck {
			return true
		}
		req.Limits = append(req.Limits, LimitRequest{})
		if err := decodeLimit(v, &req.Limits[n-1]); err != nil {
			bad, badIdx = err, n-1
		}
		return true
	})
	if n == 0 || n > MaxLimitsPerCheck {
		req.Limits = nil
		return req, fmt.Errorf("%w: limits: must hold 1 to %d limits", ErrInvalidCheck, MaxLimitsPerCheck)
	}
	if bad != nil {
		req.Limits = nil
		return req, fmt.Errorf("%w: limits[%d].%v", ErrInvalidCheck, badIdx, bad)
	}
	return req, nil
}

// decodeHead validates a check's fields other than its limits into req.
func decodeHead(op, id, user, endpoint gjson.Result, req *CheckRequest) error {
	if op.Exists() {
		switch op.Str {
		case "renew":
			req.Op = OpRenew
		case "return":
			req.Op = OpReturn
		default:
			return fmt.Errorf(`%w: op: must be "renew" or "return"`, ErrInvalidCheck)
		}
	}
	if id.Exists() {
		if id.Type != gjson.String || len(id.Str) > MaxRequestIDLen {
			return fmt.Errorf("%w: request_id: must be a string of at most %d bytes", ErrInvalidCheck, MaxRequestIDLen)
		}
		req.RequestID = id.Str
	}
	if user.Exists() {
		if user.Type != gjson.String || len(user.Str) > MaxKeyLen {
			return fmt.Errorf("%w: %s: must be a string of at most %d bytes", ErrInvalidCheck, "user", MaxKeyLen)
		}
		req.User = user.Str
	}
	if endpoint.Exists() {
		if endpoint.Type != gjson.String || len(endpoint.Str) > MaxKeyLen {
			return fmt.Errorf("%w: %s: must be a string of at most %d bytes", ErrInvalidCheck, "endpoint", MaxKeyLen)
		}
		req.Endpoint = endpoint.Str
	}
	return nil
}

// decodeCanonicalRequest reads a check written exactly as the plugin's
// encoder writes it (appendCheckHead, appendLimit), in one pass, and
// validates it as DecodeCheckRequest does, with the same code. It reports
// false for anything else, valid or not (other spacing, order or fields,
// escapes in strings, a check it would refuse), which the general reader
// then reads or refuses with its error. The general reader validates the
// JSON, then walks every object; on the bridge that was a tenth of what a
// check cost it.
func decodeCanonicalRequest(body []byte) (CheckRequest, bool) {
	var req CheckRequest
	if !utf8.Valid(body) {
		return req, false
	}
	text := string(body) // the request's strings share it, as gjson's do
	c := canonical{b: body}
	var op, id, user, endpoint gjson.Result
	ok := c.lit("{") && c.headField(text, `"op":`, &op) && c.headField(text, `"request_id":`, &id) &&
		c.headField(text, `"user":`, &user) && c.headField(text, `"endpoint":`, &endpoint)
	if !ok || !c.lit(`"limits":[`) || decodeHead(op, id, user, endpoint, &req) != nil {
		return req, false
	}
	// Room for as many limits as the body has limit objects: no string of
	// the encoder's form holds a quote, so a limit's opening appears
	// nowhere else (in any other body the count is only a wrong guess).
	req.Limits = make([]LimitRequest, 0, min(max(bytes.Count(c.b, []byte(`{"key":`)), 1), MaxLimitsPerCheck))
	for {
		var f wireLimitFields
		if len(req.Limits) == MaxLimitsPerCheck || !c.limit(text, &f) {
			return req, false
		}
		req.Limits = append(req.Limits, LimitRequest{})
		if f.decode(&req.Limits[len(req.Limits)-1]) != nil {
			return req, false
		}
		if c.lit("]}") {
			break
		}
		if !c.lit(",") {
			return req, false
		}
	}
	return req, len(c.b) == 0
}

// headField reads the string field name and its comma into dst if it is
// there; false if it is there and not in appendCheckHead's form.
func (c *canonical) headField(text, name string, dst *gjson.Result) bool {
	if !c.lit(name) {
		return true
	}
	var ok bool
	*dst, ok = c.str(text)
	return ok && c.lit(",")
}

// limit reads one limit object in appendLimit's form into f.
func (c *canonical) limit(text string, f *wireLimitFields) bool {
	var ok bool
	if !c.lit(`{"key":`) {
		return false
	}
	if f.key, ok = c.str(text); !ok || !c.lit(`,"rule":`) {
		return false
	}
	if f.rule, ok = c.str(text); !ok || !c.lit(`,"algorithm":`) {
		return false
	}
	if f.algorithm, ok = c.str(text); !ok || !c.lit(`,"limit":`) {
		return false
	}
	if f.limit, ok = c.number(text); !ok {
		return false
	}
	switch {
	case c.lit(`,"window_months":`):
		f.months, ok = c.number(text)
	case c.lit(`,"window_ms":`):
		f.window, ok = c.number(text)
	default:
		return false
	}
	if !ok || !c.lit(`,"burst":`) {
		return false
	}
	if f.burst, ok = c.number(text); !ok || !c.lit(`,"cost":`) {
		return false
	}
	if f.cost, ok = c.number(text); !ok {
		return false
	}
	if f.logOnly, ok = c.flag(text, `,"log_only":`); !ok {
		return false
	}
	if f.perUser, ok = c.flag(text, `,"per_user":`); !ok {
		return false
	}
	if f.fill, ok = c.flag(text, `,"fill":`); !ok {
		return false
	}
	if c.lit(`,"max_delay_ms":`) {
		if f.maxDelay, ok = c.number(text); !ok {
			return false
		}
	}
	if c.lit(`,"penalty":`) {
		if f.penalty, ok = c.object(text, func() bool {
			if !c.lit(`{"detection_window_ms":`) || !c.skipInt() || !c.lit(`,"violation_threshold":`) || !c.skipInt() || !c.lit(`,"multipliers":[`) {
				return false
			}
			for c.skipInt() {
				if c.lit("]}") {
					return true
				}
				if !c.lit(",") {
					return false
				}
			}
			return false
		}); !ok {
			return false
		}
	}
	if c.lit(`,"lease":`) {
		if f.lease, ok = c.object(text, func() bool {
			return c.lit(`{"size":`) && c.skipInt() && c.lit(`,"ttl_ms":`) && c.skipInt() && c.lit("}")
		}); !ok {
			return false
		}
	}
	if c.lit(`,"lease_return":`) {
		if f.ret, ok = c.object(text, func() bool {
			return c.lit(`{"tag":`) && c.skipInt() && c.lit(`,"granted":`) && c.skipInt() && c.lit(`,"units":`) && c.skipInt() && c.lit("}")
		}); !ok {
			return false
		}
	}
	return c.lit("}")
}

// at is where c.b starts in text, the whole body as a string.
func (c *canonical) at(text string) int { return len(text) - len(c.b) }

// str reads a JSON string as AppendJSONString writes text that needs no
// escape: no quote, backslash, control byte or DEL inside (the body is
// valid UTF-8 already).
func (c *canonical) str(text string) (gjson.Result, bool) {
	start := c.at(text)
	if !c.lit(`"`) {
		return gjson.Result{}, false
	}
	for i, b := range c.b {
		switch {
		case b == '"':
			c.b = c.b[i+1:]
			return gjson.Result{Type: gjson.String, Raw: text[start : start+i+2], Str: text[start+1 : start+1+i]}, true
		case b < 0x20 || b == '\\' || b == 0x7f:
			return gjson.Result{}, false
		}
	}
	return gjson.Result{}, false
}

// number reads an integer as strconv.AppendInt writes it.
func (c *canonical) number(text string) (gjson.Result, bool) {
	start := c.at(text)
	n, ok := c.integer()
	if !ok {
		return gjson.Result{}, false
	}
	return gjson.Result{Type: gjson.Number, Raw: text[start:c.at(text)], Num: float64(n)}, true
}

func (c *canonical) skipInt() bool {
	_, ok := c.integer()
	return ok
}

// flag reads field and true, the only value the encoder writes for it,
// if field is there (a zero Result if not); false for another value.
func (c *canonical) flag(text, field string) (gjson.Result, bool) {
	if !c.lit(field) {
		return gjson.Result{}, true
	}
	start := c.at(text)
	if !c.lit("true") {
		return gjson.Result{}, false
	}
	return gjson.Result{Type: gjson.True, Raw: text[start:c.at(text)]}, true
}

// object reads what read consumes and gives it as a raw JSON object.
func (c *canonical) object(text string, read func() bool) (gjson.Result, bool) {
	start := c.at(text)
	if !read() {
		return gjson.Result{}, false
	}
	return gjson.Result{Type: gjson.JSON, Raw: text[start:c.at(text)]}, true
}

// firstField keeps the first occurrence of a field, as gjson's Get does.
func firstField(dst *gjson.Result, v gjson.Result) {
	if !dst.Exists() {
		*dst = v
	}
}

// wireLimitFields are the fields of one limit object.
type wireLimitFields struct {
	key, rule, algorithm, limit, window, months, burst, cost, logOnly, perUser, fill, maxDelay, penalty, lease, ret gjson.Result
}

func decodeLimit(v gjson.Result, l *LimitRequest) error {
	if !v.IsObject() {
		return errors.New("(limit): must be an object")
	}
	var f wireLimitFields
	v.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "key":
			firstField(&f.key, v)
		case "rule":
			firstField(&f.rule, v)
		case "algorithm":
			firstField(&f.algorithm, v)
		case "limit":
			firstField(&f.limit, v)
		case "window_ms":
			firstField(&f.window, v)
		case "window_months":
			firstField(&f.months, v)
		case "burst":
			firstField(&f.burst, v)
		case "cost":
			firstField(&f.cost, v)
		case "log_only":
			firstField(&f.logOnly, v)
		case "per_user":
			firstField(&f.perUser, v)
		case "fill":
			firstField(&f.fill, v)
		case "max_delay_ms":
			firstField(&f.maxDelay, v)
		case "penalty":
			firstField(&f.penalty, v)
		case "lease":
			firstField(&f.lease, v)
		case "lease_return":
			firstField(&f.ret, v)
		}
		return true
	})
	return f.decode(l)
}

// decode validates a limit's fields into l.
func (f *wireLimitFields) decode(l *LimitRequest) error {
	if f.key.Type != gjson.String || len(f.key.Str) == 0 || len(f.key.Str) > MaxKeyLen {
		return fmt.Errorf("key: must be a string of 1 to %d bytes", MaxKeyLen)
	}
	l.Key = f.key.Str
	if f.rule.Exists() && (f.rule.Type != gjson.String || len(f.rule.Str) > MaxRuleNameLen+8) {
		return fmt.Errorf("rule: must be a string of at most %d bytes", MaxRuleNameLen+8)
	}
	l.Rule = f.rule.Str
	alg, ok := ParseAlgorithm(f.algorithm.Str)
	if !ok {
		return errors.New("algorithm: must be one of token_bucket, sliding_window, sliding_log, fixed_window")
	}
	l.Spec.Algorithm = alg
	var err error
	if l.Spec.Limit, err = wireIntField(f.limit, "limit", 1, MaxLimitValue, 0); err != nil {
		return err
	}
	switch {
	case !f.months.Exists():
		if l.Spec.WindowMS, err = wireIntField(f.window, "window_ms", 1, MaxWindowMS, 0); err != nil {
			return err
		}
	case f.window.Exists():
		return errors.New("window_months: a limit has window_ms or window_months, not both")
	case alg != FixedWindow:
		return errors.New("window_months: only a fixed_window limit has calendar months")
	default:
		if l.Spec.Months, err = wireIntField(f.months, "window_months", 1, MaxWindowMonths, 0); err != nil {
			return err
		}
		if !ValidMonths(l.Spec.Months) {
			return errors.New("window_months: must be 1, 2, 3, 4, 6 or 12")
		}
		l.Spec.WindowMS = l.Spec.Months * MonthMS
	}
	if l.Spec.Burst, err = wireIntField(f.burst, "burst", 1, MaxLimitValue, l.Spec.Limit); err != nil {
		return err
	}
	if l.Fill, err = wireBoolField(f.fill, "fill"); err != nil {
		return err
	}
	// A fill limit may cost 0: it is only asked whether it has anything
	// left (a limit charged after the response, before its request).
	minCost := int64(1)
	if l.Fill {
		minCost = 0
	}
	if l.Spec.Cost, err = wireIntField(f.cost, "cost", minCost, MaxLimitValue, 1); err != nil {
		return err
	}
	if l.LogOnly, err = wireBoolField(f.logOnly, "log_only"); err != nil {
		return err
	}
	if l.PerUser, err = wireBoolField(f.perUser, "per_user"); err != nil {
		return err
	}
	if f.maxDelay.Exists() {
		if l.MaxDelayMS, err = wireIntField(f.maxDelay, "max_delay_ms", 0, MaxMaxDelayMS, 0); err != nil {
			return err
		}
		switch {
		case l.LogOnly:
			return errors.New("max_delay_ms: a log_only limit is not throttled")
		case l.Fill:
			return errors.New("max_delay_ms: a fill limit is not throttled")
		case l.Spec.Algorithm == SlidingWindow:
			return errors.New("max_delay_ms: a sliding_window limit is not throttled (it estimates its count)")
		}
		l.Throttle = true
	}
	if p := f.penalty; p.Exists() {
		if !p.IsObject() {
			return errors.New("penalty: must be an object")
		}
		pen := &Penalty{Enabled: true}
		if pen.DetectionWindowMS, err = wireInt(p, "detection_window_ms", 1, MaxWindowMS, 0); err != nil {
			return fmt.Errorf("penalty.%w", err)
		}
		if pen.ViolationThreshold, err = wireInt(p, "violation_threshold", 1, MaxViolations, 0); err != nil {
			return fmt.Errorf("penalty.%w", err)
		}
		ms := p.Get("multipliers")
		if !ms.IsArray() {
			return errors.New("penalty.multipliers: must be an array")
		}
		marr := ms.Array()
		if len(marr) == 0 || len(marr) > MaxMultipliers {
			return fmt.Errorf("penalty.multipliers: must hold 1 to %d numbers", MaxMultipliers)
		}
		pen.Multipliers = make([]int64, len(marr))
		for j, m := range marr {
			n, ok := exactInt(m)
			if !ok || n < 1 || n > MaxMultiplier {
				return fmt.Errorf("penalty.multipliers[%d]: must be an integer from 1 to %d", j, MaxMultiplier)
			}
			pen.Multipliers[j] = n
		}
		l.Spec.Penalty = pen
	}
	if v := f.lease; v.Exists() {
		if !v.IsObject() {
			return errors.New("lease: must be an object")
		}
		if l.Spec.Lease.Size, err = wireInt(v, "size", 1, MaxLimitValue, 0); err != nil {
			return fmt.Errorf("lease.%w", err)
		}
		if l.Spec.Lease.TTLMS, err = wireInt(v, "ttl_ms", 1, MaxLeaseTTLMS, 0); err != nil {
			return fmt.Errorf("lease.%w", err)
		}
	}
	switch {
	case l.Throttle && l.Spec.Months > 0:
		return errors.New("max_delay_ms: a limit of calendar months is not throttled")
	case l.Spec.Months > 0 && l.Spec.Lease.Size > 0:
		return errors.New("lease: a limit of calendar months is not leased")
	case l.Spec.Months > 0 && f.ret.Exists():
		// A proxy returns a lease under the spec it was granted with.
		return errors.New("lease_return: a limit of calendar months holds no lease")
	case l.Throttle && l.Spec.Lease.Size > 0:
		return errors.New("lease: a throttle limit is not leased")
	case l.Fill && l.Spec.Lease.Size > 0:
		return errors.New("lease: a fill limit is not leased")
	case l.Fill && f.ret.Exists():
		return errors.New("lease_return: a fill limit holds no lease")
	}
	if v := f.ret; v.Exists() {
		if !v.IsObject() {
			return errors.New("lease_return: must be an object")
		}
		r := &l.Return
		if r.Tag, err = wireInt(v, "tag", -1<<62, 1<<62, 0); err != nil {
			return fmt.Errorf("lease_return.%w", err)
		}
		if r.Granted, err = wireInt(v, "granted", 1, MaxLimitValue, 0); err != nil {
			return fmt.Errorf("lease_return.%w", err)
		}
		if r.Units, err = wireInt(v, "units", 0, r.Granted, 0); err != nil {
			return fmt.Errorf("lease_return.%w", err)
		}
	}
	return nil
}

func wireBoolField(f gjson.Result, name string) (bool, error) {
	if !f.Exists() {
		return false, nil
	}
	if f.Type != gjson.True && f.Type != gjson.False {
		return false, fmt.Errorf("%s: must be a boolean", name)
	}
	return f.Type == gjson.True, nil
}

// wireInt reads an integer field; def applies when absent and def > 0.
func wireInt(v gjson.Result, name string, lo, hi, def int64) (int64, error) {
	return wireIntField(v.Get(name), name, lo, hi, def)
}

func wireIntField(f gjson.Result, name string, lo, hi, def int64) (int64, error) {
	if !f.Exists() && def > 0 {
		return def, nil
	}
	n, ok := exactInt(f)
	if !ok || n < lo || n > hi {
		return 0, fmt.Errorf("%s: must be an integer from %d to %d", name, lo, hi)
	}
	return n, nil
}

// exactInt accepts only JSON numbers written as plain integers, so that
// 1e400, 1.5 or -0 never turn into a silently rounded limit.
func exactInt(r gjson.Result) (int64, bool) {
	if r.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(r.Raw, 10, 64)
	return n, err == nil
}

// AppendCheckResponse encodes resp and appends it to dst.
func AppendCheckResponse(dst []byte, resp *CheckResponse) []byte {
	dst = append(dst, `{"allowed":`...)
	dst = strconv.AppendBool(dst, resp.Allowed)
	dst = appendInt(dst, `,"now_ms":`, resp.NowMS)
	if resp.DelayMS > 0 {
		dst = appendInt(dst, `,"delay_ms":`, resp.DelayMS)
	}
	dst = append(dst, `,"decisions":[`...)
	for i := range resp.Decisions {
		d := &resp.Decisions[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"allowed":`...)
		dst = strconv.AppendBool(dst, d.Allowed)
		dst = appendInt(dst, `,"limit":`, d.Limit)
		dst = appendInt(dst, `,"remaining":`, d.Remaining)
		dst = appendInt(dst, `,"reset_ms":`, d.ResetMS)
		dst = appendInt(dst, `,"retry_after_ms":`, d.RetryAfterMS)
		if g := &d.Lease; g.Units > 0 {
			dst = appendInt(dst, `,"lease":{"units":`, g.Units)
			dst = appendInt(dst, `,"ttl_ms":`, g.TTLMS)
			dst = append(appendInt(dst, `,"tag":`, g.Tag), '}')
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// DecodeCheckResponse parses a bridge answer into resp, reusing its
// Decisions slice. want is the number of limits that were asked for; an
// answer with another count is refused, so a confused bridge cannot make
// the plugin read decisions for the wrong limits.
func DecodeCheckResponse(body []byte, want int, resp *CheckResponse) error {
	if decodeCanonicalResponse(body, want, resp) {
		return nil
	}
	return decodeResponseJSON(body, want, resp)
}

// decodeCanonicalResponse reads an answer written exactly as
// AppendCheckResponse writes it, which is what the bridge sends, in one
// pass; it reports false, leaving resp to be overwritten, for anything
// else (other spacing, order or fields, numbers it would have to round),
// which decodeResponseJSON then reads. The general reader walks the JSON
// once per field; on the proxy's wasm engines that was most of the time a
// call-out answer took.
func decodeCanonicalResponse(b []byte, want int, resp *CheckResponse) bool {
	c := canonical{b: b}
	if !c.lit(`{"allowed":`) {
		return false
	}
	allowed, ok := c.boolean()
	if !ok || !c.lit(`,"now_ms":`) {
		return false
	}
	now, ok := c.integer()
	if !ok {
		return false
	}
	var delay int64
	if c.lit(`,"delay_ms":`) {
		if delay, ok = c.integer(); !ok || delay <= 0 {
			return false
		}
	}
	if !c.lit(`,"decisions":[`) {
		return false
	}
	resp.Decisions = resp.Decisions[:0]
	for !c.lit("]}") {
		if len(resp.Decisions) == want || len(resp.Decisions) > 0 && !c.lit(",") {
			return false
		}
		var d Decision
		if !c.lit(`{"allowed":`) {
			return false
		}
		if d.Allowed, ok = c.boolean(); !ok || !c.lit(`,"limit":`) {
			return false
		}
		if d.Limit, ok = c.integer(); !ok || !c.lit(`,"remaining":`) {
			return false
		}
		if d.Remaining, ok = c.integer(); !ok || !c.lit(`,"reset_ms":`) {
			return false
		}
		if d.ResetMS, ok = c.integer(); !ok || !c.lit(`,"retry_after_ms":`) {
			return false
		}
		if d.RetryAfterMS, ok = c.integer(); !ok {
			return false
		}
		if c.lit(`,"lease":{"units":`) {
			g := &d.Lease
			if g.Units, ok = c.integer(); !ok || !c.lit(`,"ttl_ms":`) {
				return false
			}
			if g.TTLMS, ok = c.integer(); !ok || !c.lit(`,"tag":`) {
				return false
			}
			if g.Tag, ok = c.integer(); !ok || !c.lit("}") || g.Units <= 0 {
				return false
			}
		}
		if !c.lit("}") {
			return false
		}
		resp.Decisions = append(resp.Decisions, d)
	}
	if len(c.b) != 0 || len(resp.Decisions) != want {
		return false
	}
	resp.Allowed, resp.NowMS, resp.DelayMS = allowed, now, delay
	return true
}

// canonical consumes an answer in AppendCheckResponse's exact form.
type canonical struct{ b []byte }

func (c *canonical) lit(s string) bool {
	if len(c.b) < len(s) || string(c.b[:len(s)]) != s {
		return false
	}
	c.b = c.b[len(s):]
	return true
}

func (c *canonical) boolean() (bool, bool) {
	if c.lit("true") {
		return true, true
	}
	return false, c.lit("false")
}

// integer reads what strconv.AppendInt writes: an optional minus, then
// digits without a leading zero, within int64.
func (c *canonical) integer() (int64, bool) {
	neg := len(c.b) > 0 && c.b[0] == '-'
	i := 0
	if neg {
		i = 1
	}
	start := i
	var u uint64
	b := c.b
	for i < len(b) {
		d := b[i] - '0' // wraps above 9 for bytes below '0'
		if d > 9 {
			break
		}
		u = u*10 + uint64(d)
		i++
	}
	// Nineteen digits and fewer are exact in a uint64 (below 1e19 <
	// 2^64); more are out of range whatever u wrapped to.
	switch n := i - start; {
	case n == 0, n > 19, n > 1 && b[start] == '0', neg && u == 0:
		return 0, false
	case !neg && u > 1<<63-1, neg && u > 1<<63:
		return 0, false
	}
	c.b = b[i:]
	if neg {
		return -int64(u-1) - 1, true
	}
	return int64(u), true
}

// decodeResponseJSON reads any JSON rendering of an answer.
func decodeResponseJSON(body []byte, want int, resp *CheckResponse) error {
	if !gjson.ValidBytes(body) {
		return errors.New("check response: not valid JSON")
	}
	// gjson.ParseBytes would copy the body; nothing read here outlives the
	// call (numbers and booleans only), so a view is safe.
	root := gjson.Parse(bytesView(body))
	allowed := root.Get("allowed")
	if allowed.Type != gjson.True && allowed.Type != gjson.False {
		return errors.New("check response: allowed: must be a boolean")
	}
	resp.Allowed = allowed.Type == gjson.True
	resp.NowMS = root.Get("now_ms").Int()
	// A delay counts only when positive, as the fast path reads it.
	resp.DelayMS = max(0, root.Get("delay_ms").Int())
	resp.Decisions = resp.Decisions[:0]
	var bad error
	root.Get("decisions").ForEach(func(_, d gjson.Result) bool {
		if len(resp.Decisions) == want {
			bad = errors.New("check response: decisions: more than asked for")
			return false
		}
		dec := Decision{
			Allowed:      d.Get("allowed").Type == gjson.True,
			Limit:        d.Get("limit").Int(),
			Remaining:    d.Get("remaining").Int(),
			ResetMS:      d.Get("reset_ms").Int(),
			RetryAfterMS: d.Get("retry_after_ms").Int(),
		}
		// A lease counts only when it holds units: an answer without one
		// reads as the zero grant, as the fast path reads it.
		if g := d.Get("lease"); g.IsObject() {
			if units := g.Get("units").Int(); units > 0 {
				dec.Lease = LeaseGrant{Units: units, TTLMS: g.Get("ttl_ms").Int(), Tag: g.Get("tag").Int()}
			}
		}
		resp.Decisions = append(resp.Decisions, dec)
		return true
	})
	if bad != nil {
		return bad
	}
	if len(resp.Decisions) != want {
		return fmt.Errorf("check response: decisions: got %d, want %d", len(resp.Decisions), want)
	}
	return nil
}

// bytesView returns b as a string without copying. The string must not be
// kept beyond b's lifetime.
func bytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
