package rules

// Rules that come from a bridge's policy store: a rule on its own, as the
// bridge's rules API validates it, the policy document the bridge serves
// to plugins, and where a plugin fetches it from (rules_from). Each goes
// through the rule validation of a configuration (parser.rule), so a rule
// the plugin would refuse is refused by the bridge with the same field
// path.

import (
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"
)

// RulesFrom says where a plugin fetches rules from besides its own: a
// bridge's policy endpoint, asked every Interval on the root context.
type RulesFrom struct {
	Cluster    string // upstream cluster, default bridge.cluster
	Authority  string // :authority, default bridge.authority
	Path       string // default /v1/rate-limit/policy
	IntervalMS uint32 // how often the policy is asked for, default 5s
	TimeoutMS  uint32 // call-out timeout, default 1s
}

// PolicyPath is where a bridge serves its policy document.
const PolicyPath = "/v1/rate-limit/policy"

// Bounds of rules_from.interval: a fetch that changed nothing costs one
// small call-out, so the floor is what keeps a misconfiguration cheap.
const (
	MinPolicyIntervalMS = 100
	MaxPolicyIntervalMS = 3600_000
)

func (p *parser) rulesFrom(v gjson.Result, path string, b Bridge) *RulesFrom {
	if !v.Exists() {
		return nil
	}
	rf := &RulesFrom{Cluster: b.Cluster, Authority: b.Authority, Path: PolicyPath, IntervalMS: 5000, TimeoutMS: 1000}
	if !p.object(v, path, "cluster", "authority", "path", "interval", "timeout") {
		return rf
	}
	p.callTarget(v, path, &rf.Cluster, &rf.Authority, &rf.Path)
	rf.IntervalMS = uint32(p.duration(v.Get("interval"), join(path, "interval"), int64(rf.IntervalMS), MinPolicyIntervalMS, MaxPolicyIntervalMS))
	rf.TimeoutMS = uint32(p.duration(v.Get("timeout"), join(path, "timeout"), int64(rf.TimeoutMS), 1, 60_000))
	return rf
}

// ParseRule validates one rule object, such as an element of a
// configuration's rules, exactly as ParseConfig validates that element.
// Errors name the field inside the rule ("limit", "match.paths"), the path
// ParseConfig reports after "rules[i].". What needs the rest of a
// configuration (names unique among rules and categories, at most 63 of
// them, the top-level penalty a rule without its own inherits) is not
// checked here.
func ParseRule(data []byte) (Rule, error) {
	if len(data) > MaxConfigSize {
		return Rule{}, &ConfigError{Err: fmt.Errorf("rule is %d bytes, more than %d", len(data), MaxConfigSize)}
	}
	if err := jsonText(data, "rule"); err != nil {
		return Rule{}, err
	}
	var p parser
	r := p.rule(gjson.ParseBytes(data), "", nil)
	if p.err != nil {
		return Rule{}, p.err
	}
	return r, nil
}

// PolicyVersion names one state of a bridge's policy store: the store (an
// id made when its database was created) and its version, one higher with
// every change.
type PolicyVersion struct {
	Store   string
	Version int64
}

// ETag is the entity tag a bridge gives this version of its policy.
func (v PolicyVersion) ETag() string {
	return `"` + v.Store + ":" + strconv.FormatInt(v.Version, 10) + `"`
}

// Newer reports whether v should replace cur: a version of another store
// (its database was replaced) or a later one of the same. A bridge that
// lags behind another may serve an older version for a moment; it is not
// applied.
func (v PolicyVersion) Newer(cur PolicyVersion) bool {
	return v.Store != cur.Store || v.Version > cur.Version
}

// WithPolicy returns c with the rules of a bridge's policy document added
// to its own:
//
//	{"store": "<id>", "version": 7, "rules": [<rule>, ...]}
//
// The document's rules are validated as a configuration's rules are (and
// inherit c's top-level penalty as those do), and together with c's own
// as ParseConfig checks a whole configuration: names unique among rules
// and categories, at most 63 rules and categories. Rules are ordered by
// priority, c's own first among equals. On error c is unchanged and
// nothing is returned; errors name the document's field ("rules[2].limit").
// c must be a configuration from ParseConfig, not one WithPolicy returned.
func (c *Config) WithPolicy(doc []byte) (*Config, PolicyVersion, error) {
	var v PolicyVersion
	if len(doc) > MaxConfigSize {
		return nil, v, &ConfigError{Err: fmt.Errorf("policy is %d bytes, more than %d", len(doc), MaxConfigSize)}
	}
	if err := jsonText(doc, "policy"); err != nil {
		return nil, v, err
	}
	root := gjson.ParseBytes(doc)
	var p parser
	if !p.object(root, "", "store", "version", "rules") {
		return nil, v, p.err
	}
	v.Store = p.str(root.Get("store"), "store", "")
	v.Version = p.integer(root.Get("version"), "version", -1, 0, 1<<53)
	if p.err == nil && (v.Store == "" || v.Version < 0) {
		p.fail("", "needs store and version")
	}
	var defPenalty *Penalty
	if c.Penalty.Enabled {
		defPenalty = &c.Penalty
	}
	remote := p.rules(root.Get("rules"), "rules", defPenalty)
	if p.err != nil {
		return nil, v, p.err
	}
	own := map[string]string{}
	for i := range c.Rules {
		own[c.Rules[i].Name] = "a rule"
	}
	for i := range c.Categories {
		own[c.Categories[i].Name] = "a category"
	}
	for i := range remote {
		if what, dup := own[remote[i].Name]; dup {
			// remote is sorted; name the rule by its name, not a shifted index.
			return nil, v, &ConfigError{Path: "rules", Err: fmt.Errorf("%q is already the name of %s in the plugin configuration", remote[i].Name, what)}
		}
	}
	if n := len(c.Rules) + len(remote) + len(c.Categories) + 1; n > MaxLimitsPerCheck {
		return nil, v, &ConfigError{Path: "rules", Err: fmt.Errorf("%d rules and categories with the plugin's own: at most %d together, since all that match one request are checked in one call", n-1, MaxLimitsPerCheck-1)}
	}
	merged := *c
	merged.Rules = make([]Rule, 0, len(c.Rules)+len(remote))
	merged.Rules = append(append(merged.Rules, c.Rules...), remote...)
	sortRules(merged.Rules)
	return &merged, v, nil
}
