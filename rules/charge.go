package rules

// Limits charged after the response (a rule's on_response): what a
// request costs is known only once the upstream has answered (the tokens
// a language model spent, a failed login's 401).

import "github.com/tidwall/gjson"

// OnResponse makes a rule's limit charged after the response rather than
// before the request. Before the request the limit is only asked whether
// it has anything left (cost 0); the request passes while it has. After
// the response it is charged Charge's units, capped at what it has left.
type OnResponse struct {
	Statuses   StatusSet // the response statuses that charge; none: every one
	CostHeader string    // response header holding the cost; "": the limit's cost
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

// Charge is what a response with status and, when o has a CostHeader,
// that header's value costHeader charges the limit: nothing for a status
// o does not charge; else the header's value, a decimal integer capped at
// MaxLimitValue, or def (the limit's cost) when there is no such value.
func (o *OnResponse) Charge(status int, costHeader string, def int64) int64 {
	if !o.Statuses.Empty() && !o.Statuses.Has(status) {
		return 0
	}
	if o.CostHeader == "" {
		return def
	}
	n, ok := decimalCost(costHeader)
	if !ok {
		return def
	}
	return n
}

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
	if !p.object(v, path, "statuses", "cost_header") {
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
