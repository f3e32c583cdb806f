package rules

// A client's requests mostly evaluate to the same plan, one after the
// other: the same rules, identity and keys. On a proxy, evaluating is most
// of what refusing a client over its limit costs, and about a fifth of what
// a request that asks the bridge costs the plugin. A PlanCache keeps the
// plans its user chooses (the plugin: those of clients seen twice in a
// row, KeepRepeated, and of refused requests) with everything Evaluate
// read to make them (the path; the method and the host if a rule or a key
// looked at them; each header it asked for, present or not; and the peer
// address and certificate name if it asked), and gives a request that
// reads the same the same plan without evaluating. Evaluate depends on
// nothing else but the Config and the time, so the plan is the one
// Evaluate would make: a plan identified by a verified JWT is given only
// while its token has not expired, and one whose token did not verify,
// which may verify later, is not kept.

// planCacheSlots is how many plans a PlanCache keeps, one per slot, picked
// by the request's path and the value of the config's first identity header.
// Clients that share a slot push each other's plans out, so a VM serving
// n clients in turn keeps about (1-1/planCacheSlots)^(n-1) of them: with 64
// slots a fifth of 100 clients, with 256 two thirds. A slot's entry (a
// plan and its texts, about a kilobyte) is made when it is first used.
const planCacheSlots = 256

// PlanCache is a small cache of plans, for one goroutine (one proxy VM).
// The zero value is ready to use.
type PlanCache struct {
	slots [planCacheSlots]*planEntry // nil until first kept into
	// kept counts the entries in use; while it is zero a lookup is not
	// even tried, so a proxy whose clients neither come back nor are
	// refused pays nothing for it. hits counts lookups answered since the
	// last Sweep.
	kept, hits int
	rec        reads // what the evaluation in progress read
	// last is the entry the last Lookup answered or the last Keep
	// filled, for Retag; nil after anything else.
	last *planEntry
	// seen is, by slot, the planHash of the request KeepRepeated last
	// saw there, or 1 on it; 0: none.
	seen [planCacheSlots]uint64
}

// reads is what one Evaluate read of its request, as views valid while
// the request's headers are.
type reads struct {
	cfg                  *Config
	valid                bool // a miss was just evaluated and may be kept
	headers              [][2]string
	sourceRead, timeRead bool
	// until: what was read holds while the time is before it (Unix
	// seconds, holdsUntil); 0: whatever the time.
	until                int64
	methodRead, hostRead bool
	peerRead             bool
}

type planEntry struct {
	cfg                *Config // nil: the slot is free
	method, path, host string
	// headers: name, value ("" for an absent header); the one at index
	// is the config's index header, whose value the lookup has already.
	headers    [][2]string
	index      int
	sourceRead bool
	source     string
	until      int64 // reads' until
	peerRead   bool
	peer       string
	// methodRead, hostRead: Evaluate looked at the method, the host; a
	// request's other method or host gets the same plan when it did not.
	methodRead, hostRead bool
	plan                 Plan
	tag                  uint64
	buf                  []byte // the texts above and the plan's, which view it
	// check is the plan's check after its request id (appendCheckTail),
	// rendered on its first use since the plan was kept; empty until
	// then (a rendered one ends in "]}").
	check []byte
}

// Lookup returns the plan kept for a request that read what r reads under
// c, and the tag it was kept with. The plan is the cache's own: read it, or
// copy it (Plan.CopyFrom), while r's headers can be read; its texts, and
// those of a copy, are valid until the next Keep.
func (pc *PlanCache) Lookup(c *Config, r *Request) (plan *Plan, tag uint64, ok bool) {
	pc.last = nil
	if pc.kept == 0 {
		return nil, 0, false
	}
	idx, h := c.planPlace(r)
	e := pc.slots[h%planCacheSlots]
	if e == nil || e.cfg != c || !e.matches(r, idx) || e.until != 0 && r.clock() >= e.until {
		return nil, 0, false
	}
	pc.hits++
	pc.rec.valid = false // what was last evaluated is not this request
	pc.last = e
	return &e.plan, e.tag, true
}

// Retag gives the plan the last Lookup answered, or the last Keep kept, a
// new tag, if nothing came between: a plan kept for a request that went
// on, then refused, is the refusal's from then on.
func (pc *PlanCache) Retag(tag uint64) {
	if pc.last != nil {
		pc.last.tag = tag
	}
}

// AppendKeptCheck appends what AppendCheckRequest(dst, requestID, user,
// endpoint, limits) does, when user, endpoint and limits encode as those
// of the plan the last Lookup answered or the last Keep kept, if nothing
// came between: what follows the request id is rendered once per kept
// plan, not once per request. ok false, dst as given: there is no such
// plan, or this request's check differs (a lease asked for or handed
// back, a throttle's delay lowered).
func (pc *PlanCache) AppendKeptCheck(dst []byte, requestID, user, endpoint string, limits []PlannedLimit) (_ []byte, ok bool) {
	e := pc.last
	if e == nil || user != e.plan.Identity.User || endpoint != e.plan.Endpoint || len(limits) != len(e.plan.Limits) {
		return dst, false
	}
	for i := range limits {
		if !sameEncoding(&limits[i], &e.plan.Limits[i]) {
			return dst, false
		}
	}
	if len(e.check) == 0 {
		e.check = appendCheckTail(e.check, user, endpoint, limits)
	}
	return append(appendCheckStart(dst, OpDecide, requestID), e.check...), true
}

// Evaluate is c.Evaluate(r, plan), noting what it reads of r, so that Keep
// may keep the plan until the next Evaluate.
func (pc *PlanCache) Evaluate(c *Config, r *Request, plan *Plan) {
	pc.last = nil
	pc.rec = reads{cfg: c, headers: pc.rec.headers[:0]}
	r.rec = &pc.rec
	c.Evaluate(r, plan)
	r.rec = nil
	pc.rec.valid = true
}

// KeepRepeated is Keep for a request that is one of a client's many,
// most likely, but may be its only one: it keeps plan when the request
// before it at r's slot had the same value of the index header and a path
// alike (planHash), and otherwise only notes r there. So a proxy whose
// every request comes from a new client pays a comparison per request,
// not a Keep, which costs about as much as evaluating, and a client's
// second request keeps its plan for the third. It reports whether the
// plan was kept.
func (pc *PlanCache) KeepRepeated(c *Config, r *Request, plan *Plan, tag uint64) bool {
	pc.last = nil
	if !pc.keepable(c, plan) {
		return false // nor noted: a client whose token does not verify never has one kept
	}
	h := pc.hashOf(c, r)
	if seen := &pc.seen[h%planCacheSlots]; *seen != h|1 {
		*seen = h | 1
		return false
	}
	pc.keep(c, r, plan, tag, h)
	return true
}

// keepable tells whether Keep would keep plan, the last Evaluate's under c.
func (pc *PlanCache) keepable(c *Config, plan *Plan) bool {
	rec := &pc.rec
	return rec.valid && rec.cfg == c && !rec.timeRead && !plan.Exempt && len(plan.Limits) > 0
}

// hashOf is r's planHash under c, with the index header's value as the
// last Evaluate read it, if it did, rather than looked up again.
func (pc *PlanCache) hashOf(c *Config, r *Request) uint64 {
	if name := c.planIndexHeader(); name != "" && pc.rec.valid && pc.rec.cfg == c {
		for _, kv := range pc.rec.headers {
			if kv[0] == name {
				return planHash(Hash(kv[1]), r.Path)
			}
		}
	}
	_, h := c.planPlace(r)
	return h
}

// Keep keeps plan, which the last Evaluate made for r, with the caller's
// tag, for requests that read the same. It must come before the caller
// changes the plan's limits, and while r's headers can still be read. A
// plan that read the time other than through a verified token's expiry
// (a token that did not verify), an exempt plan or one without limits is
// not kept.
func (pc *PlanCache) Keep(c *Config, r *Request, plan *Plan, tag uint64) {
	pc.last = nil
	if pc.keepable(c, plan) {
		pc.keep(c, r, plan, tag, pc.hashOf(c, r))
	}
}

// keep is Keep of a keepable plan whose request's planHash is h.
func (pc *PlanCache) keep(c *Config, r *Request, plan *Plan, tag, h uint64) {
	rec := &pc.rec
	slot := &pc.slots[h%planCacheSlots]
	if *slot == nil {
		*slot = new(planEntry)
	}
	e := *slot
	rec.valid = false
	if e.cfg == nil {
		pc.kept++
	}
	pc.last = e
	e.check = e.check[:0]
	// The entry's texts are views of its own buffer, reused from one plan
	// to the next, so that keeping a plan allocates nothing once the
	// buffer has grown: written in one order, then cut in the same.
	id := &plan.Identity
	texts := [...]string{r.Method, r.Path, r.Host, plan.Endpoint, id.User, id.APIKey, id.Tenant, id.Tier, "", ""}
	if rec.sourceRead {
		texts[8] = r.Source
	}
	if rec.peerRead {
		texts[9] = r.Peer
	}
	b := e.buf[:0]
	for _, t := range texts {
		b = append(b, t...)
	}
	for _, h := range rec.headers {
		b = append(b, h[0]...)
		b = append(b, h[1]...)
	}
	e.buf = b
	off := 0
	e.cfg, e.tag = c, tag
	e.method, e.path, e.host = e.text(&off, len(r.Method)), e.text(&off, len(r.Path)), e.text(&off, len(r.Host))
	e.plan.CopyFrom(plan)
	e.plan.Endpoint = e.text(&off, len(plan.Endpoint))
	e.plan.Identity.User, e.plan.Identity.APIKey = e.text(&off, len(id.User)), e.text(&off, len(id.APIKey))
	e.plan.Identity.Tenant, e.plan.Identity.Tier = e.text(&off, len(id.Tenant)), e.text(&off, len(id.Tier))
	e.sourceRead, e.source, e.until = rec.sourceRead, e.text(&off, len(texts[8])), rec.until
	e.peerRead, e.peer = rec.peerRead, e.text(&off, len(texts[9]))
	e.methodRead, e.hostRead = rec.methodRead, rec.hostRead
	e.headers, e.index = e.headers[:0], -1
	name := c.planIndexHeader()
	for i, h := range rec.headers {
		if e.index < 0 && h[0] == name {
			e.index = i
		}
		e.headers = append(e.headers, [2]string{e.text(&off, len(h[0])), e.text(&off, len(h[1]))})
	}
}

// text is the n bytes of e's buffer at *off, as a view, and moves *off
// past them.
func (e *planEntry) text(off *int, n int) string {
	t := bytesView(e.buf[*off : *off+n])
	*off += n
	return t
}

// Sweep forgets every kept plan unless a lookup was answered since the
// last Sweep: a proxy calls it now and then (once a second), so that once
// no kept plan is asked for, requests stop paying for lookups.
func (pc *PlanCache) Sweep() {
	if pc.hits == 0 {
		pc.Reset()
	}
	pc.hits = 0
}

// Reset forgets every kept plan.
func (pc *PlanCache) Reset() {
	pc.last = nil
	if pc.kept == 0 {
		return
	}
	for _, e := range pc.slots {
		if e != nil {
			e.cfg = nil
		}
	}
	pc.kept = 0
}

// matches tells whether r reads what e's request read, under e's config.
// idx is the value of the config's index header in r.
func (e *planEntry) matches(r *Request, idx string) bool {
	if e.path != r.Path || (e.methodRead && e.method != r.Method) || (e.hostRead && e.host != r.Host) ||
		e.index >= 0 && e.headers[e.index][1] != idx { // another client's, most often: no header looked up
		return false
	}
	for i := range e.headers {
		if h := &e.headers[i]; i != e.index && r.Headers.Header(h[0]) != h[1] {
			return false
		}
	}
	return (!e.sourceRead || r.source() == e.source) && (!e.peerRead || r.peer(e.cfg.peerDNS()) == e.peer)
}

// peerDNS tells whether c's peer_certificate source, if any, takes the
// DNS name.
func (c *Config) peerDNS() bool {
	for i := range c.Identity.Sources {
		if s := &c.Identity.Sources[i]; s.Kind == SourcePeerCertificate {
			return s.PeerDNS
		}
	}
	return false
}

// planIndexHeader is the header whose value, with the path, picks a plan's
// slot: the first identity source's, which Evaluate reads first for any
// request a limit applies to; "" when identity comes from the address.
func (c *Config) planIndexHeader() string {
	if len(c.Identity.Sources) == 0 {
		return ""
	}
	return c.Identity.Sources[0].Header
}

// planPlace is request r's value of c's index header and its planHash.
func (c *Config) planPlace(r *Request) (idx string, h uint64) {
	if name := c.planIndexHeader(); name != "" {
		idx = r.Headers.Header(name)
	}
	return idx, planHash(Hash(idx), r.Path)
}

// planHash picks a request's slot (modulo planCacheSlots): by the Hash of
// its value of the config's index header, and by the path's length and
// last byte rather than a hash of the path: one client on a few paths
// rarely has two that share both. Small enough to be inlined: each request
// of a proxy that keeps plans works it out.
func planHash(idxHash uint64, path string) uint64 {
	h := uint64(len(path)) << 8
	if len(path) > 0 {
		h |= uint64(path[len(path)-1])
	}
	return idxHash ^ h*0x9E3779B97F4A7C15
}

// CopyFrom makes p a copy of src, its limits and their keys in p's own
// buffers (a caller may change them), its texts those of src. What only
// Evaluate uses (the matched rules, the key ends) is not copied.
func (p *Plan) CopyFrom(src *Plan) {
	keys, ends, limits, matched, decoded := p.keys[:0], p.ends, p.Limits, p.matched, p.decoded
	*p = *src
	p.decoded = decoded[:0] // p's own: src's identity may view src's
	for i := range src.Limits {
		keys = append(keys, src.Limits[i].Key...)
	}
	p.keys, p.ends, p.matched = keys, ends[:0], matched[:0]
	p.Limits = append(limits[:0], src.Limits...)
	start := 0
	for i := range p.Limits {
		end := start + len(p.Limits[i].Key)
		p.Limits[i].Key = p.keys[start:end:end]
		start = end
	}
}
