package rules

// Limits charged after the response (a rule's on_response): what a
// request costs is known only once the upstream has answered (the tokens
// a language model spent, a failed login's 401).

import (
	"strings"

	"github.com/tidwall/gjson"
)

// OnResponse makes a rule's limit charged after the response rather than
// before the request. Before the request the limit is only asked whether
// it has anything left (cost 0); the request passes while it has. After
// the response it is charged Charge's units, capped at what it has left.
type OnResponse struct {
	Statuses StatusSet // the response statuses that charge; none: every one
	// Where the response says what it cost, at most one: a header's value
	// (HeaderCost), or a number in its JSON body at a path of object keys
	// (BodyCost). Neither: the limit's cost.
	CostHeader string
	CostBody   []string
}

// StatusSet is a set of HTTP status codes, 100 to 599.
type StatusSet struct{ bits [10]uint64 }

// Add puts the codes lo to hi (inclusive) in s.
func (s *StatusSet) Add(lo, hi int) {
	for c := max(lo, 0); c <= hi && c < 640; c++ {
		s.bits[c/64] |= 1 << (c % 64)
	}
}

// Has reports whether code is in s.
func (s *StatusSet) Has(code int) bool {
	return code >= 0 && code < 640 && s.bits[code/64]&(1<<(code%64)) != 0
}

// Empty reports whether s holds no code.
func (s *StatusSet) Empty() bool { return s.bits == [10]uint64{} }

// Charge is what a response with status charges the limit: nothing for a
// status o does not charge; else cost, what the response said it cost,
// when it said (found), or def, the limit's cost.
func (o *OnResponse) Charge(status int, cost int64, found bool, def int64) int64 {
	switch {
	case !o.Charges(status):
		return 0
	case found:
		return cost
	}
	return def
}

// Charges reports whether a response with status charges the limit.
func (o *OnResponse) Charges(status int) bool { return o.Statuses.Empty() || o.Statuses.Has(status) }

// HeaderCost reads a cost header's value: a decimal integer (no sign, no
// space), capped at MaxLimitValue; false for any other value.
func HeaderCost(v string) (int64, bool) { return decimalCost(v) }

// decimalCost reads s, ASCII digits only (no sign, no space), capped at
// MaxLimitValue.
func decimalCost(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = min(n*10+int64(c-'0'), MaxLimitValue)
	}
	return n, true
}

// StatusCode reads a :status header ("200"), 0 when it is not one.
func StatusCode(s string) int {
	if len(s) != 3 {
		return 0
	}
	n, ok := decimalCost(s)
	if !ok {
		return 0
	}
	return int(n)
}

// onResponse reads the on_response object at path of a limit (a rule's,
// or a tier's for it and its endpoint overrides) with action, leased when
// it or an override has a lease.
func (p *parser) onResponse(v gjson.Result, path string, action Action, leased bool) *OnResponse {
	if !p.object(v, path, "statuses", "cost_header", "cost_body") {
		return nil
	}
	o := &OnResponse{}
	if sv := v.Get("statuses"); sv.Exists() {
		sp := join(path, "statuses")
		if !sv.IsArray() || len(sv.Array()) == 0 {
			p.fail(sp, `must be a non-empty array of status codes (401) and classes ("4xx")`)
			return nil
		}
		for i, e := range sv.Array() {
			lo, hi, ok := statusRange(e)
			if !ok {
				p.fail(index(sp, i), `must be a status code from 100 to 599 or a class "1xx" to "5xx", got %s`, e.Raw)
				return nil
			}
			o.Statuses.Add(lo, hi)
		}
	}
	if h := v.Get("cost_header"); h.Exists() {
		hp := join(path, "cost_header")
		if o.CostHeader = p.headerName(h, hp, ""); o.CostHeader == "" && p.err == nil {
			p.fail(hp, "is empty (leave it out to charge the limit's cost)")
		}
	}
	if b := v.Get("cost_body"); b.Exists() {
		bp := join(path, "cost_body")
		if o.CostHeader != "" && p.err == nil {
			p.fail(bp, "set one of cost_header and cost_body, not both")
		}
		o.CostBody = p.costPath(b, bp)
	}
	switch {
	case action == Throttle:
		p.fail(path, "a limit charged on the response is not throttled: its cost is not known before the request")
	case leased:
		p.fail(path, "a limit charged on the response is not leased: its cost is not known before the request")
	}
	return o
}

// statusRange reads a status code (401) or class ("4xx") as the codes it
// covers.
func statusRange(v gjson.Result) (lo, hi int, ok bool) {
	switch v.Type {
	case gjson.Number:
		n, ok := exactInt(v)
		if !ok || n < 100 || n > 599 {
			return 0, 0, false
		}
		return int(n), int(n), true
	case gjson.String:
		if s := v.Str; len(s) == 3 && s[0] >= '1' && s[0] <= '5' && s[1:] == "xx" {
			lo := int(s[0]-'0') * 100
			return lo, lo + 99, true
		}
	}
	return 0, 0, false
}

// Bounds of a cost_body path.
const (
	maxCostPathKeys   = 8
	maxCostPathKeyLen = 64
)

// costPath reads a cost_body path: object keys joined by dots
// (usage.total_tokens), each of letters, digits, _ and -.
func (p *parser) costPath(v gjson.Result, path string) []string {
	text := p.str(v, path, "")
	if p.err != nil {
		return nil
	}
	var keys []string
	for _, k := range strings.Split(text, ".") {
		ok := k != "" && len(k) <= maxCostPathKeyLen
		for i := 0; i < len(k) && ok; i++ {
			c := k[i]
			ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		}
		if !ok {
			p.fail(path, `%q is not a path of object keys such as "usage.total_tokens" (keys of 1 to %d letters, digits, _ and -, joined by dots)`, text, maxCostPathKeyLen)
			return nil
		}
		keys = append(keys, k)
	}
	if len(keys) > maxCostPathKeys {
		p.fail(path, "%q has more than %d keys", text, maxCostPathKeys)
		return nil
	}
	return keys
}
