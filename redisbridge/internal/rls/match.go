package rls

// Entry is one key and value of a request's descriptor.
type Entry struct{ Key, Value string }

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool {
	_, ok := c.domains[domain]
	return ok
}

// HasDomains reports whether any domain is configured.
func (c *Config) HasDomains() bool { return len(c.domains) > 0 }

// Match is the limit a request descriptor has in domain's tree, as
// envoyproxy/ratelimit finds it: each entry, in order, must match a
// descriptor one level further down, by its key and value, else by one
// with "*" wildcards that takes them (wildcard), else by its key alone
// (a descriptor without value takes every value); and the descriptor the
// last entry matched must have a rate_limit. nil when it has none.
func (c *Config) Match(domain string, entries []Entry) *Limit {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil
	}
	for i, e := range entries {
		full := e.Key + "_" + e.Value
		next := n.children[full]
		if next == nil {
			for i := range n.wildcards {
				if w := &n.wildcards[i]; w.matches(full) {
					next = w.child
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.limit
		}
		n = next
	}
	return nil
}
