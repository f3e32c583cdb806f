package policy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/tidwall/gjson"

	"github.com/sluicehq/sluice/rules"
)

// Rule is a rule of the policy store: a rule object of the plugin's
// configuration, one column per field (migrations/0002_rules.sql). Fields
// whose default does not depend on the rest of a configuration are stored
// with it filled in; penalty, which a rule without one inherits from the
// plugin's top-level penalty, is stored as written, or not at all.
type Rule struct {
	Name      string
	Scope     string // "user+endpoint"
	Algorithm string
	Limit     int64
	WindowMS  int64
	Burst     int64 // token bucket capacity; 0: the limit
	Cost      int64
	Paths     []string // match.paths as written
	Methods   []string // match.methods, upper-case
	Hosts     []string // match.hosts, lower-case
	Headers   json.RawMessage
	Query     json.RawMessage // match.query (migrations/0005_rule_query.sql)
	Penalty   json.RawMessage
	Lease     json.RawMessage // as written (migrations/0003_rule_lease.sql)
	// OnResponse is as written (migrations/0006_rule_on_response.sql).
	OnResponse json.RawMessage
	Action     string
	// MaxDelayMS is a throttle rule's max_delay, default filled in; 0 for
	// other actions (migrations/0004_rule_max_delay.sql).
	MaxDelayMS int64
	Priority   int
	Enabled    bool
	// WindowMonths is a window of calendar months; 0: WindowMS alone
	// (migrations/0007_window_months.sql).
	WindowMonths int64

	CreatedAt, UpdatedAt time.Time
	UpdatedBy            string
}

// ParseRule validates a rule object with the plugin's own validation
// (rules.ParseRule: a rule the plugin would refuse is refused, with the
// same field path) and returns it in the store's form.
func ParseRule(body []byte) (Rule, error) {
	pr, err := rules.ParseRule(body)
	if err != nil {
		return Rule{}, err
	}
	// The rule is valid JSON of known fields, each once; read what the
	// parsed form does not keep as written.
	root := gjson.ParseBytes(body)
	r := Rule{
		Name: pr.Name, Scope: pr.Scope.String(), Algorithm: pr.Spec.Algorithm.String(),
		Limit: pr.Spec.Limit, WindowMS: pr.Spec.WindowMS, WindowMonths: pr.Spec.Months, Cost: pr.Spec.Cost,
		Methods: pr.Match.Methods, Hosts: pr.Match.Hosts,
		Action: pr.Action.String(), Priority: pr.Priority, Enabled: pr.Enabled, MaxDelayMS: pr.MaxDelayMS,
	}
	if root.Get("burst").Exists() {
		r.Burst = pr.Spec.Burst
	}
	for _, p := range pr.Match.Paths {
		r.Paths = append(r.Paths, p.Raw)
	}
	r.Headers, r.Query = fieldDocs(pr.Match.Headers), fieldDocs(pr.Match.Query)
	if p := root.Get("penalty"); p.Exists() {
		r.Penalty = compact(p.Raw)
	}
	if l := root.Get("lease"); l.Exists() {
		r.Lease = compact(l.Raw)
	}
	if o := root.Get("on_response"); o.Exists() {
		r.OnResponse = compact(o.Raw)
	}
	return r, nil
}

// fieldDocs is the JSON of a match's header or query conditions, nil for
// none.
func fieldDocs(ms []rules.FieldMatch) json.RawMessage {
	if len(ms) == 0 {
		return nil
	}
	docs := make([]fieldDoc, len(ms))
	for i, m := range ms {
		docs[i] = fieldDoc{Name: m.Name, Invert: m.Invert}
		switch m.Op {
		case rules.FieldPresent:
			present := true
			docs[i].Present = &present
		case rules.FieldEquals:
			docs[i].Equals = &m.Value
		case rules.FieldPrefix:
			docs[i].Prefix = &m.Value
		case rules.FieldSuffix:
			docs[i].Suffix = &m.Value
		case rules.FieldContains:
			docs[i].Contains = &m.Value
		}
	}
	b, _ := json.Marshal(docs)
	return b
}

// fieldDoc is a header or query condition as the configuration writes it.
type fieldDoc struct {
	Name     string  `json:"name"`
	Present  *bool   `json:"present,omitempty"`
	Equals   *string `json:"equals,omitempty"`
	Prefix   *string `json:"prefix,omitempty"`
	Suffix   *string `json:"suffix,omitempty"`
	Contains *string `json:"contains,omitempty"`
	Invert   bool    `json:"invert,omitempty"`
}

// compact is the JSON text raw without its spaces. ParseRule has read
// it, so it is valid and has no field twice.
func compact(raw string) json.RawMessage {
	var b bytes.Buffer
	_ = json.Compact(&b, []byte(raw))
	return b.Bytes()
}

// ruleDoc is a rule object as the plugin's configuration writes it.
type ruleDoc struct {
	Name      string          `json:"name"`
	Match     *matchDoc       `json:"match,omitempty"`
	Scope     string          `json:"scope"`
	Action    string          `json:"action"`
	MaxDelay  string          `json:"max_delay,omitempty"`
	Priority  int             `json:"priority"`
	Enabled   bool            `json:"enabled"`
	Algorithm string          `json:"algorithm"`
	Limit     int64           `json:"limit"`
	Window    string          `json:"window"`
	Burst     int64           `json:"burst,omitempty"`
	Cost      int64           `json:"cost"`
	Penalty   json.RawMessage `json:"penalty,omitempty"`
	Lease     json.RawMessage `json:"lease,omitempty"`
	// OnResponse is written last: a bridge's rule object then reads as
	// one of an earlier bridge with one more field.
	OnResponse json.RawMessage `json:"on_response,omitempty"`
}

type matchDoc struct {
	Paths   []string        `json:"paths,omitempty"`
	Methods []string        `json:"methods,omitempty"`
	Hosts   []string        `json:"hosts,omitempty"`
	Headers json.RawMessage `json:"headers,omitempty"`
	Query   json.RawMessage `json:"query,omitempty"`
}

// MarshalJSON writes r as a rule object of the plugin's configuration,
// which ParseRule reads back to the same rule.
func (r Rule) MarshalJSON() ([]byte, error) {
	d := ruleDoc{
		Name: r.Name, Scope: r.Scope, Action: r.Action, Priority: r.Priority, Enabled: r.Enabled,
		Algorithm: r.Algorithm, Limit: r.Limit,
		Window: string((&rules.LimitSpec{WindowMS: r.WindowMS, Months: r.WindowMonths}).AppendWindow(nil)),
		Burst:  r.Burst, Cost: r.Cost, Penalty: r.Penalty, Lease: r.Lease, OnResponse: r.OnResponse,
	}
	if r.MaxDelayMS > 0 {
		d.MaxDelay = rules.FormatDurationMS(r.MaxDelayMS)
	}
	if len(r.Paths)+len(r.Methods)+len(r.Hosts)+len(r.Headers)+len(r.Query) > 0 {
		d.Match = &matchDoc{Paths: r.Paths, Methods: r.Methods, Hosts: r.Hosts, Headers: r.Headers, Query: r.Query}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // paths and names as written
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Entry is a rule with what the store knows about it, as the rules API
// shows it: {"rule": {...}, "created_at", "updated_at", "updated_by"}.
type Entry struct {
	Rule Rule
}

// MarshalJSON implements json.Marshaler.
func (e Entry) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Rule      Rule   `json:"rule"`
		CreatedAt string `json:"created_at"`
		UpdatedAt string `json:"updated_at"`
		UpdatedBy string `json:"updated_by"`
	}{e.Rule, e.Rule.CreatedAt.UTC().Format(time.RFC3339Nano), e.Rule.UpdatedAt.UTC().Format(time.RFC3339Nano), e.Rule.UpdatedBy})
}
