// Package rls is the configuration of the bridge's Envoy rate limit
// service (envoy.service.ratelimit.v3): the descriptor trees of
// envoyproxy/ratelimit's YAML files, read as that service reads them, and
// the limit each request descriptor matches there.
package rls

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/sluicehq/sluice/internal/filewatch"
	"github.com/sluicehq/sluice/rules"
)

// Unit is a rate limit's unit, numbered as the service's protocol numbers
// them (RateLimitResponse.RateLimit.Unit).
type Unit int32

// The units, in seconds as envoyproxy/ratelimit counts them (a month is
// 30 days, a year 365).
var units = []struct {
	name    string
	unit    Unit
	seconds int64
}{
	{"second", 1, 1}, {"minute", 2, 60}, {"hour", 3, 3600}, {"day", 4, 86400},
	{"month", 5, 30 * 86400}, {"year", 6, 365 * 86400}, {"week", 7, 7 * 86400},
}

// WindowMS is the unit's length in milliseconds; 0 for an unknown unit.
func (u Unit) WindowMS() int64 {
	for _, x := range units {
		if x.unit == u {
			return x.seconds * 1000
		}
	}
	return 0
}

// String is the unit's name as the configuration writes it.
func (u Unit) String() string {
	for _, x := range units {
		if x.unit == u {
			return x.name
		}
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// Limit is a descriptor's rate limit.
type Limit struct {
	// Name is the limit's rate_limit.name, "" when it has none: answers
	// carry it (Envoy writes it into its X-RateLimit headers) and
	// replaces name it.
	Name string
	// Place is where the limit is in the tree ("domain.key_value.key"):
	// metrics name a limit without a Name by it.
	Place           string
	RequestsPerUnit int64 // 0 refuses every call
	Unit            Unit
	// UnitMultiplier is how many units a window lasts; 0 or 1, one. Only
	// a caller's override has one (RateLimitOverride.unit_multiplier).
	UnitMultiplier uint32
	Unlimited      bool
	ShadowMode     bool     // counted and reported, never refusing
	Replaces       []string // names of the limits this one replaces when both apply
	// Budget: a call takes what it costs or, when less, what is left,
	// and passes while anything is (the descriptor's budget: true, for
	// spending charged after the fact).
	Budget bool
	// Quota: the limit is one of a call's quota limits, which refuse it
	// only all together (the descriptor's quota_mode).
	Quota bool
	// Metadata is the descriptor's metadata, for answers' dynamic
	// metadata (--rls-response-metadata): values as JSON holds them,
	// json.Number for numbers. nil when it has none.
	Metadata map[string]any
	// Shared is, by entry, the value a counter of the limit is kept under
	// in place of the request's: the pattern of the wildcard with
	// share_threshold that took the entry, so every value it takes
	// counts together; "" for the request's own value. nil when no
	// entry's is shared.
	Shared []string
}

// WindowMS is the length of the limit's window in milliseconds.
func (l *Limit) WindowMS() int64 {
	return l.Unit.WindowMS() * int64(max(l.UnitMultiplier, 1))
}

// MetricName is the limit's name in metrics: its Name, else its Place.
func (l *Limit) MetricName() string {
	if l.Name != "" {
		return l.Name
	}
	return l.Place
}

// node is a descriptor of the tree: its limit (nil: none) and the
// descriptors under it, by "key_value", or "key" for any value.
type node struct {
	limit     *Limit
	children  map[string]*node
	wildcards []wildcard // children with a "*", in file order
}

// wildcard is a descriptor with a "*" in its value (or its key): each
// "*" takes any run of characters, none included. It is matched, as
// envoyproxy/ratelimit matches it, against a request entry's key and
// value joined as the tree names them ("key_value"), so the key takes
// part: key user with value a_* takes the entry user_a with value x
// ("user_a_x"). parts is that name split at the "*"s.
type wildcard struct {
	parts []string
	fixed int // the length of the parts together
	child *node
}

// matches reports whether the wildcard takes value, an entry's
// "key_value": the first part begins it, the last ends it, and the others
// come between, in order.
func (w *wildcard) matches(value string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(value) < w.fixed || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Config is the domains' descriptor trees.
type Config struct {
	domains map[string]*node
}

// Dump lists the configured limits, a line each in the form of
// envoyproxy/ratelimit's /rlconfig ("edge.path_/login: unit=HOUR
// requests_per_unit=5, shadow_mode: false, quota_mode: false"; an
// unlimited one has unit UNKNOWN and 0 requests), sorted.
func (c *Config) Dump() string {
	var limits []*Limit
	var walk func(n *node)
	walk = func(n *node) {
		if n.limit != nil {
			limits = append(limits, n.limit)
		}
		for _, child := range n.children {
			walk(child)
		}
	}
	for _, root := range c.domains {
		walk(root)
	}
	slices.SortFunc(limits, func(a, b *Limit) int { return strings.Compare(a.Place, b.Place) })
	var b strings.Builder
	for _, l := range limits {
		unit, per := "UNKNOWN", int64(0)
		if !l.Unlimited {
			unit, per = strings.ToUpper(l.Unit.String()), l.RequestsPerUnit
		}
		fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t\n", l.Place, unit, per, l.ShadowMode, l.Quota)
	}
	return b.String()
}

// Domains are the configured domains, sorted.
func (c *Config) Domains() []string {
	var out []string
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// ReadFiles reads path, a YAML file or a directory of them (*.yaml,
// *.yml), as envoyproxy/ratelimit reads its configuration directory: the
// files, by name, for Parse.
func ReadFiles(path string) (map[string][]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	names := []string{path}
	if fi.IsDir() {
		names = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				names = append(names, filepath.Join(path, e.Name()))
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: no .yaml or .yml file", path)
		}
	}
	return filewatch.Read(names...)
}

// Parse reads configuration files by name, in the order of their names.
// With merge, a file may configure a domain an earlier one did: its
// descriptors join the domain's, and a descriptor both configure at the
// top is refused; without, the domain is. An error names the file and
// the field at fault, and nothing is kept of a configuration refused.
func Parse(files map[string][]byte, merge bool) (*Config, error) {
	docs := make(map[string]func() (map[string]any, error), len(files))
	for name, data := range files {
		docs[name] = func() (map[string]any, error) { return readYAML(data) }
	}
	return build(docs, merge)
}

// build makes a configuration of documents by name, each read into the
// tree readYAML reads a file into: Parse's files, ParseXDS's resources.
// They are read in the order of their names.
func build(docs map[string]func() (map[string]any, error), merge bool) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	names := slices.Sorted(maps.Keys(docs))
	owner := map[string]string{}
	for _, name := range names {
		domain, root, err := parseTree(docs[name]())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		prev, dup := owner[domain]
		switch {
		case !dup:
			owner[domain] = name
			c.domains[domain] = root
		case !merge:
			return nil, fmt.Errorf("%s: domain %q is configured in %s too", name, domain, prev)
		default:
			into := c.domains[domain]
			for _, key := range slices.Sorted(maps.Keys(root.children)) {
				if _, both := into.children[key]; both {
					return nil, fmt.Errorf("%s: descriptor %s.%s is configured in %s too", name, domain, key, prev)
				}
				into.children[key] = root.children[key]
			}
			into.wildcards = append(into.wildcards, root.wildcards...)
			owner[domain] += ", " + name
		}
	}
	return c, nil
}

// parseTree reads one document: its domain and its tree.
func parseTree(top map[string]any, err error) (string, *node, error) {
	if err != nil {
		return "", nil, err
	}
	if err := known(top, "", "domain", "descriptors"); err != nil {
		return "", nil, err
	}
	domain, err := str(top, "", "domain")
	if err != nil {
		return "", nil, err
	}
	if domain == "" {
		return "", nil, errors.New("domain: required")
	}
	root := &node{children: map[string]*node{}}
	if err := root.load(top["descriptors"], "descriptors", domain, nil); err != nil {
		return "", nil, err
	}
	return domain, root, nil
}

// load adds the descriptors of list (at field path at) under n; parent is
// the name of n's place in the tree, and shared the values its entries
// share (Limit.Shared), one per level above.
func (n *node) load(list any, at, parent string, shared []string) error {
	if list == nil {
		return nil
	}
	items, ok := list.([]any)
	if !ok {
		return fmt.Errorf("%s: want a list", at)
	}
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", at, i)
		d, ok := item.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want a mapping", path)
		}
		if err := known(d, path, "key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
			"value_to_metric", "share_threshold", "metadata", "budget"); err != nil {
			return err
		}
		key, err := str(d, path, "key")
		if err != nil {
			return err
		}
		if key == "" {
			return fmt.Errorf("%s.key: required", path)
		}
		value, err := str(d, path, "value")
		if err != nil {
			return err
		}
		name := key
		if value != "" {
			name += "_" + value
		}
		if _, dup := n.children[name]; dup {
			return fmt.Errorf("%s: descriptor %s.%s is configured twice", path, parent, name)
		}
		shadow, err := boolean(d, path, "shadow_mode")
		if err != nil {
			return err
		}
		quota, err := boolean(d, path, "quota_mode") // as shadow_mode, of the descriptor's own rate_limit
		if err != nil {
			return err
		}
		// Metrics here are per limit (Limit.MetricName), whatever these
		// say.
		for _, f := range []string{"detailed_metric", "value_to_metric"} {
			if _, err := boolean(d, path, f); err != nil {
				return err
			}
		}
		var meta map[string]any
		if m, ok := d["metadata"]; ok && m != nil {
			if meta, ok = m.(map[string]any); !ok {
				return fmt.Errorf("%s.metadata: want a mapping", path)
			}
		}
		share, err := boolean(d, path, "share_threshold")
		if err != nil {
			return err
		}
		wild := strings.Contains(name, "*")
		if share && !wild {
			return fmt.Errorf("%s.share_threshold: only for a value with a *", path)
		}
		var mine []string // nil while no entry above or here shares
		if share || shared != nil {
			mine = append(slices.Clip(shared), "")
			if share {
				mine[len(shared)] = value
				if !strings.Contains(value, "*") {
					mine[len(shared)] = name // the * is in the key
				}
			}
		}
		budget, err := boolean(d, path, "budget")
		if err != nil {
			return err
		}
		child := &node{children: map[string]*node{}}
		if rl, ok := d["rate_limit"]; ok {
			if child.limit, err = parseLimit(rl, path+".rate_limit", parent+"."+name, shadow); err != nil {
				return err
			}
			child.limit.Shared, child.limit.Budget, child.limit.Quota, child.limit.Metadata = mine, budget, quota, meta
		} else if budget {
			return fmt.Errorf("%s.budget: only with a rate_limit", path)
		}
		if err := child.load(d["descriptors"], path+".descriptors", parent+"."+name, mine); err != nil {
			return err
		}
		n.children[name] = child
		if wild {
			w := wildcard{parts: strings.Split(name, "*"), child: child}
			w.fixed = len(name) - (len(w.parts) - 1)
			n.wildcards = append(n.wildcards, w)
		}
	}
	return nil
}

// parseLimit reads a rate_limit.
func parseLimit(v any, path, place string, shadow bool) (*Limit, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want a mapping", path)
	}
	if err := known(m, path, "unit", "requests_per_unit", "unlimited", "name", "replaces"); err != nil {
		return nil, err
	}
	l := &Limit{Place: place, ShadowMode: shadow}
	var err error
	if l.Unlimited, err = boolean(m, path, "unlimited"); err != nil {
		return nil, err
	}
	if l.Name, err = str(m, path, "name"); err != nil {
		return nil, err
	}
	unit, err := str(m, path, "unit")
	if err != nil {
		return nil, err
	}
	for _, u := range units {
		if strings.EqualFold(unit, u.name) {
			l.Unit = u.unit
		}
	}
	switch {
	case l.Unlimited && unit != "":
		return nil, fmt.Errorf("%s.unit: must not be given with unlimited", path)
	case !l.Unlimited && l.Unit == 0:
		return nil, fmt.Errorf("%s.unit: %q is not second, minute, hour, day, week, month or year", path, unit)
	}
	if n, ok := m["requests_per_unit"]; ok {
		num, ok := n.(json.Number)
		i, err := num.Int64()
		if !ok || err != nil || i < 0 || i > rules.MaxLimitValue {
			return nil, fmt.Errorf("%s.requests_per_unit: must be an integer from 0 to %d", path, int64(rules.MaxLimitValue))
		}
		l.RequestsPerUnit = i
	} else if !l.Unlimited {
		return nil, fmt.Errorf("%s.requests_per_unit: required", path)
	}
	if r, ok := m["replaces"]; ok {
		list, ok := r.([]any)
		if !ok {
			return nil, fmt.Errorf("%s.replaces: want a list", path)
		}
		for i, e := range list {
			ep := fmt.Sprintf("%s.replaces[%d]", path, i)
			rm, ok := e.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: want a mapping with name", ep)
			}
			if err := known(rm, ep, "name"); err != nil {
				return nil, err
			}
			name, err := str(rm, ep, "name")
			if err != nil {
				return nil, err
			}
			switch {
			case name == "":
				return nil, fmt.Errorf("%s.name: required", ep)
			case name == l.Name:
				return nil, fmt.Errorf("%s.name: a limit cannot replace itself", ep)
			}
			l.Replaces = append(l.Replaces, name)
		}
	}
	return l, nil
}

// known refuses a field envoyproxy/ratelimit's files do not have here:
// the first by name, so a file gets the same error every time.
func known(m map[string]any, path string, fields ...string) error {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		found := false
		for _, f := range fields {
			found = found || k == f
		}
		if !found {
			return fmt.Errorf("%s: unknown field (want %s)", join(path, k), strings.Join(fields, ", "))
		}
	}
	return nil
}

func str(m map[string]any, path, field string) (string, error) {
	v, ok := m[field]
	if !ok || v == nil {
		return "", nil
	}
	if s, ok := v.(string); ok { // a scalar as written (readYAML)
		return s, nil
	}
	return "", fmt.Errorf("%s: want a string", join(path, field))
}

func boolean(m map[string]any, path, field string) (bool, error) {
	v, ok := m[field]
	if !ok || v == nil {
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%s: want true or false", join(path, field))
	}
	return b, nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}
