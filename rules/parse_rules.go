package rules

// Parsing of rules (limits selected by request attributes) and categories
// (named groups of paths under one limit).

import (
	"sort"
	"strings"

	"github.com/tidwall/gjson"
)

func (p *parser) rules(v gjson.Result, path string, defPenalty *Penalty) []Rule {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array")
		return nil
	}
	var out []Rule
	for i, e := range v.Array() {
		rp := index(path, i)
		r := p.rule(e, rp, defPenalty)
		if p.err != nil {
			return nil
		}
		for j := range out {
			if out[j].Name == r.Name && p.err == nil {
				p.fail(join(rp, "name"), "%q is already the name of %s", r.Name, index(path, j))
			}
		}
		out = append(out, r)
	}
	sortRules(out)
	return out
}

// sortRules orders rules by priority, lower first; the order they came in
// breaks ties.
func sortRules(rs []Rule) {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Priority < rs[j].Priority })
}

// ruleFields are the fields of a rule object.
var ruleFields = append([]string{"name", "match", "scope", "action", "max_delay", "priority", "enabled", "on_response"}, limitFields...)

// rule validates one rule object at path. It is the one validation of a
// rule: for the rules of a configuration, for a rule on its own
// (ParseRule, the bridge's rules API) and for the rules a bridge serves
// (Config.WithPolicy). What it cannot see, names shared with other rules
// and categories and how many there are, the caller checks.
func (p *parser) rule(e gjson.Result, rp string, defPenalty *Penalty) Rule {
	if !p.object(e, rp, ruleFields...) {
		return Rule{}
	}
	r := Rule{
		Name:     p.name(e.Get("name"), join(rp, "name")),
		Match:    p.match(e.Get("match"), join(rp, "match")),
		Scope:    p.scope(e.Get("scope"), join(rp, "scope"), "user"),
		Action:   p.action(e.Get("action"), join(rp, "action")),
		Priority: int(p.integer(e.Get("priority"), join(rp, "priority"), 100, -1_000_000, 1_000_000)),
		Enabled:  p.boolean(e.Get("enabled"), join(rp, "enabled"), true),
	}
	r.Spec = p.limitSpec(e, rp, actionDefault(LimitSpec{}, r.Action), defPenalty)
	r.MaxDelayMS = p.limitAction(e, rp, r.Action, &r.Spec)
	if v := e.Get("on_response"); v.Exists() {
		r.OnResponse = p.onResponse(v, join(rp, "on_response"), r.Action, r.Spec.Lease.Size > 0)
	}
	r.head = newPlannedHead(r.Name, &r.Spec, r.Action == LogOnly, r.Scope.Has(ScopeUser), r.OnResponse)
	return r
}

func (p *parser) match(v gjson.Result, path string) Match {
	var m Match
	if !v.Exists() {
		return m
	}
	if !p.object(v, path, "paths", "methods", "hosts", "headers", "query") {
		return m
	}
	m.Paths = p.pathPatterns(v.Get("paths"), join(path, "paths"))
	m.Methods = p.strings(v.Get("methods"), join(path, "methods"), func(s, ep string) string {
		s = strings.ToUpper(s)
		if s == "" || strings.ContainsAny(s, " \t\r\n") {
			p.fail(ep, "%q is not an HTTP method", s)
		}
		return s
	})
	m.Hosts = p.strings(v.Get("hosts"), join(path, "hosts"), func(s, ep string) string {
		s = strings.ToLower(s)
		if err := ValidHostPattern(s); err != nil {
			p.fail(ep, "%v", err)
		}
		return s
	})
	m.Headers = p.fieldMatches(v.Get("headers"), join(path, "headers"), func(v gjson.Result, path string) string {
		return p.headerName(v, path, "")
	})
	m.Query = p.fieldMatches(v.Get("query"), join(path, "query"), p.queryName)
	return m
}

// maxQueryNameLen bounds a query parameter's name in the configuration.
const maxQueryNameLen = 256

// queryName reads a query parameter's name, decoded ("" when absent).
func (p *parser) queryName(v gjson.Result, path string) string {
	name := p.str(v, path, "")
	if len(name) > maxQueryNameLen {
		p.fail(path, "longer than %d bytes", maxQueryNameLen)
	}
	return name
}

// fieldMatches reads a match's conditions on headers or query
// parameters, each a name, one of present, equals, prefix, suffix and
// contains, and invert; name reads the name.
func (p *parser) fieldMatches(v gjson.Result, path string, name func(gjson.Result, string) string) []FieldMatch {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array")
		return nil
	}
	var out []FieldMatch
	for i, e := range v.Array() {
		ep := index(path, i)
		if !p.object(e, ep, "name", "present", "equals", "prefix", "suffix", "contains", "invert") {
			return out
		}
		fm := FieldMatch{Name: name(e.Get("name"), join(ep, "name"))}
		if fm.Name == "" && p.err == nil {
			p.fail(join(ep, "name"), "is required")
		}
		for op := FieldPresent; op <= FieldContains; op++ {
			v := e.Get(op.String())
			switch {
			case !v.Exists():
				continue
			case fm.Op != 0:
				p.fail(ep, "set one of present, equals, prefix, suffix and contains, not %s and %s", fm.Op, op)
				return out
			}
			fm.Op = op
			switch op {
			case FieldPresent:
				if !p.boolean(v, join(ep, "present"), true) {
					// present: false means "absent": presence, inverted.
					fm.Invert = true
				}
			case FieldEquals:
				fm.Value = p.str(v, join(ep, "equals"), "")
			default:
				// An empty text would hold for every value, none too.
				if fm.Value = p.str(v, join(ep, op.String()), ""); fm.Value == "" && p.err == nil {
					p.fail(join(ep, op.String()), "is empty (present asks for a value)")
				}
			}
		}
		if fm.Op == 0 && p.err == nil {
			p.fail(ep, "needs one of present, equals, prefix, suffix and contains")
		}
		if p.boolean(e.Get("invert"), join(ep, "invert"), false) {
			fm.Invert = !fm.Invert
		}
		out = append(out, fm)
	}
	return out
}

// Defaults of the well-known categories; the environment may change the
// limit and window (env.go).
var categoryDefaults = map[string]struct {
	limit, windowMS int64
	scope           Scope
}{
	"chat":   {10, 60_000, Scope(ScopeUser)},
	"upload": {2, 600_000, Scope(ScopeUser)},
	"auth":   {5, 60_000, Scope(ScopeIP)},
}

func (p *parser) categories(v gjson.Result, path string, defPenalty *Penalty) []Category {
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		p.fail(path, "must be an array")
		return nil
	}
	var out []Category
	fields := append([]string{"name", "paths", "scope", "action", "max_delay"}, limitFields...)
	for i, e := range v.Array() {
		cp := index(path, i)
		if !p.object(e, cp, fields...) {
			return nil
		}
		c := Category{Name: p.name(e.Get("name"), join(cp, "name"))}
		def := LimitSpec{}
		defScope := "user"
		if d, ok := categoryDefaults[c.Name]; ok {
			def = LimitSpec{Algorithm: SlidingWindow, Limit: d.limit, WindowMS: d.windowMS, Burst: d.limit, Cost: 1}
			if s, ok := p.envSpecs[c.Name]; ok {
				def = s
			}
			defScope = d.scope.String()
		}
		c.Paths = p.pathPatterns(e.Get("paths"), join(cp, "paths"))
		if len(c.Paths) == 0 && p.err == nil {
			p.fail(join(cp, "paths"), "needs at least one path pattern")
		}
		c.Scope = p.scope(e.Get("scope"), join(cp, "scope"), defScope)
		c.Action = p.action(e.Get("action"), join(cp, "action"))
		c.Spec = p.limitSpec(e, cp, actionDefault(def, c.Action), defPenalty)
		c.MaxDelayMS = p.limitAction(e, cp, c.Action, &c.Spec)
		c.head = newLimitHead(c.Name, &c.Spec, c.Action == LogOnly, c.Scope.Has(ScopeUser))
		for j := range out {
			if out[j].Name == c.Name && p.err == nil {
				p.fail(join(cp, "name"), "%q is already the name of %s", c.Name, index(path, j))
			}
		}
		out = append(out, c)
	}
	return out
}
