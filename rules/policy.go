package rules

import (
	"net/netip"
	"strconv"
)

// HeaderSource gives the request headers. Names are lower-case; "" means
// absent. The plugin implements it over the proxy's header map, tests over
// a map.
type HeaderSource interface {
	Header(name string) string
}

// Request is what the policy sees of an HTTP request.
type Request struct {
	Method string
	Path   string // may carry a query string; matching ignores it
	Host   string // :authority, port allowed
	Source string // connection peer, Envoy source.address ("1.2.3.4:5678")
	// Peer is the name of the client certificate the config's
	// peer_certificate source reads ("" for none, or no mutual TLS).
	Peer    string
	Headers HeaderSource
	NowUnix int64 // for JWT exp/nbf
	// Lazy, when set, gives Source and NowUnix when they are left empty,
	// and only if Evaluate needs them: a proxy then asks its host for
	// neither on requests no limit applies to.
	Lazy LazyFields
	// Tokens, when set, caches verified JWTs across requests.
	Tokens *TokenCache

	rec       *reads // set while a PlanCache records what Evaluate reads
	peerAsked bool   // Lazy gave Peer, empty or not
}

// LazyFields supplies Request fields on first use.
type LazyFields interface {
	Source() string
	NowUnix() int64
	// PeerName is the first URI (dns: DNS name) of the client
	// certificate the proxy verified, "" when there is none.
	PeerName(dns bool) string
}

// peer is Peer, asked of Lazy once when it is empty.
func (r *Request) peer(dns bool) string {
	if r.rec != nil {
		r.rec.peerRead = true
	}
	if r.Peer == "" && !r.peerAsked && r.Lazy != nil {
		r.Peer, r.peerAsked = r.Lazy.PeerName(dns), true
	}
	return r.Peer
}

func (r *Request) source() string {
	if r.rec != nil {
		r.rec.sourceRead = true
	}
	if r.Source == "" && r.Lazy != nil {
		r.Source = r.Lazy.Source()
	}
	return r.Source
}

// method and host are r.Method and r.Host, noted as read for a PlanCache.
func (r *Request) method() string {
	if r.rec != nil {
		r.rec.methodRead = true
	}
	return r.Method
}

func (r *Request) host() string {
	if r.rec != nil {
		r.rec.hostRead = true
	}
	return r.Host
}

// readsTime notes that what Evaluate read depends on the time in a way a
// plan cache cannot bound: its plan is not kept.
func (r *Request) readsTime() {
	if r.rec != nil {
		r.rec.timeRead = true
	}
}

// clock is the time, for a reader that notes itself how what it reads
// depends on it (holdsUntil, readsTime), or for the plan cache's own check.
func (r *Request) clock() int64 {
	if r.NowUnix == 0 && r.Lazy != nil {
		r.NowUnix = r.Lazy.NowUnix()
	}
	return r.NowUnix
}

// holdsUntil notes that what Evaluate read holds while the time is before
// a verified token's expiry, exp (Unix seconds; 0: none), plus leeway:
// the token passes until then, and nothing else it was checked for
// changes with the time going on.
func (r *Request) holdsUntil(exp, leeway int64) {
	if r.rec == nil || exp == 0 {
		return
	}
	if u := exp + leeway; r.rec.until == 0 || u < r.rec.until {
		r.rec.until = u
	}
}

// header is the value of a request header, "" when absent.
func (r *Request) header(name string) string {
	v := r.Headers.Header(name)
	if r.rec != nil {
		r.rec.headers = append(r.rec.headers, [2]string{name, v})
	}
	return v
}

// Plan is the outcome of evaluating a request: its identity, whether it is
// exempt, and the limits that apply with their counter keys. Reuse one Plan
// per worker: Evaluate overwrites it without allocating once its buffers
// have grown.
type Plan struct {
	Exempt   bool
	Identity Identity
	// IdentitySource says where the user id came from: "jwt", "jwt_payload",
	// "header", "query", "peer_certificate", or "" when anonymous.
	IdentitySource string
	// JWTError is set when a bearer token was present but did not verify;
	// the request is then anonymous.
	JWTError error
	Endpoint string // path without query
	Limits   []PlannedLimit

	// ipResolved: Identity.IP has been worked out. Evaluate does so only
	// when a key or an IP exemption needs it: parsing the client address
	// is most of the identity work of a request keyed by user, and a proxy
	// has to ask its host for the peer address first. ResolveClientIP does
	// it later, for whoever needs the address anyway (events).
	ipResolved bool

	keys    []byte
	ends    []int
	matched []int32 // rules (i) and categories (^i) that match, in order
	decoded []byte  // query parameters' values decoded for the identity (queryParam)
}

// Evaluate resolves the identity of r and collects every applicable limit
// into plan. Limits come in order: rules by priority, then categories, then
// the tier limit. A disabled config or an exempt client yields no limits.
// Matching comes first and needs no identity, so a request no rule or
// category matches, with no tiers configured, costs no identity work (its
// plan has no identity and is not marked exempt).
func (c *Config) Evaluate(r *Request, plan *Plan) {
	plan.Exempt = false
	plan.Limits = plan.Limits[:0]
	plan.keys = plan.keys[:0]
	plan.ends = plan.ends[:0]
	plan.matched = plan.matched[:0]
	plan.decoded = plan.decoded[:0]
	plan.IdentitySource = ""
	plan.JWTError = nil
	plan.Endpoint = stripQuery(r.Path)
	plan.Identity = Identity{}
	plan.ipResolved = false
	if !c.Enabled {
		return
	}
	for i := range c.Rules {
		rule := &c.Rules[i]
		if rule.Enabled && rule.Match.matches(r, plan.Endpoint) {
			plan.matched = append(plan.matched, int32(i))
		}
	}
	for i := range c.Categories {
		if anyPathMatches(c.Categories[i].Paths, plan.Endpoint) {
			plan.matched = append(plan.matched, ^int32(i))
		}
	}
	if len(plan.matched) == 0 && len(c.Tiers.List) == 0 {
		return
	}
	c.identify(r, plan)
	if len(c.Exemptions.IPs) > 0 {
		c.ResolveClientIP(r, plan)
	}
	if c.exempt(&plan.Identity) {
		plan.Exempt = true
		return
	}
	id := &plan.Identity
	for _, m := range plan.matched {
		if m >= 0 {
			rule := &c.Rules[m]
			plan.add(c, r, rule.Name, &rule.Spec, rule.head, rule.Action, rule.MaxDelayMS, rule.Scope, rule.OnResponse)
		} else {
			cat := &c.Categories[^m]
			plan.add(c, r, cat.Name, &cat.Spec, cat.head, cat.Action, cat.MaxDelayMS, cat.Scope, nil)
		}
	}
	if tier := c.Tiers.Find(id.Tier); tier != nil && !tier.Unlimited {
		spec, name, head := &tier.Spec, tier.keyName, tier.head
		for j := range tier.Endpoints {
			if ep := &tier.Endpoints[j]; ep.Match.matchPath(plan.Endpoint) {
				spec, name, head = &ep.Spec, ep.keyName, ep.head
				break
			}
		}
		plan.add(c, r, name, spec, head, tier.Action, tier.MaxDelayMS, tier.Scope, tier.OnResponse)
	}
	// Keys were appended to one buffer that may have moved while growing;
	// slice it only now.
	start := 0
	for i := range plan.Limits {
		plan.Limits[i].Key = plan.keys[start:plan.ends[i]:plan.ends[i]]
		start = plan.ends[i]
	}
}

// MayApply reports whether a limit of c may apply to a request for path
// (as :path has it, query and all). When it is false, Evaluate gives every
// request for path no limits and no exemption, whatever else it carries:
// c is disabled, or it has no tiers and no enabled rule or category
// matches the path (a rule that names no paths matches any). A proxy asks
// it before reading the rest of a request, which a request no limit
// applies to then never needs.
func (c *Config) MayApply(path string) bool {
	if !c.Enabled {
		return false
	}
	if len(c.Tiers.List) > 0 {
		return true
	}
	endpoint := stripQuery(path)
	for i := range c.Rules {
		rule := &c.Rules[i]
		if rule.Enabled && (len(rule.Match.Paths) == 0 || anyPathMatches(rule.Match.Paths, endpoint)) {
			return true
		}
	}
	for i := range c.Categories {
		if anyPathMatches(c.Categories[i].Paths, endpoint) {
			return true
		}
	}
	return false
}

// anyPathMatches reports whether one of patterns matches path (without its
// query).
func anyPathMatches(patterns []PathPattern, path string) bool {
	for i := range patterns {
		if patterns[i].matchPath(path) {
			return true
		}
	}
	return false
}

func (p *Plan) add(c *Config, r *Request, name string, spec *LimitSpec, head *limitHead, action Action, maxDelayMS int64, scope Scope, onResp *OnResponse) {
	id := &p.Identity
	if !p.ipResolved && keyNeedsIP(scope, id, c.Identity.Anonymous) {
		c.ResolveClientIP(r, p)
	}
	method := "" // a key shows the method only with the method in its scope
	if scope.Has(ScopeMethod) {
		method = r.method()
	}
	p.keys = AppendKey(p.keys, name, scope, id, c.Identity.Anonymous, method, p.Endpoint)
	p.ends = append(p.ends, len(p.keys))
	p.Limits = append(p.Limits, PlannedLimit{
		Rule: name, Spec: spec, Action: action, MaxDelayMS: maxDelayMS, PerUser: scope.Has(ScopeUser), OnResponse: onResp, head: head,
	})
}

// ResolveClientIP works out plan's Identity.IP, the client address, from
// r unless Evaluate already did, and returns it. r must be the request
// plan was evaluated for, its headers and lazy fields still readable.
func (c *Config) ResolveClientIP(r *Request, plan *Plan) netip.Addr {
	if plan.ipResolved {
		return plan.Identity.IP
	}
	ipc := &c.Identity.ClientIP
	var xff, xri string
	if ipc.TrustedProxyDepth > 0 || len(ipc.TrustedProxies) > 0 {
		xff = r.header("x-forwarded-for")
	}
	if ipc.UseXRealIP {
		xri = r.header("x-real-ip")
	}
	plan.Identity.IP = ClientIP(ipc, xff, xri, r.source())
	plan.ipResolved = true
	return plan.Identity.IP
}

// IPResolved reports whether plan's Identity.IP has been worked out.
func (p *Plan) IPResolved() bool { return p.ipResolved }

func (c *Config) identify(r *Request, plan *Plan) {
	id := &plan.Identity

	var payload []byte // the verified JWT payload, for the tier claim
	for i := range c.Identity.Sources {
		src := &c.Identity.Sources[i]
		var v string
		switch {
		case src.Kind == SourcePeerCertificate:
			v = r.peer(src.PeerDNS)
		case src.Param != "": // a query source, or a JWT in the URL
			v = plan.queryParam(r, src.Param)
		default:
			v = r.header(src.Header)
		}
		if v == "" {
			continue
		}
		switch src.Kind {
		case SourceJWT:
			var pl []byte
			var exp int64
			var err error
			if r.Tokens != nil {
				pl, exp, err = r.Tokens.verify(v, src, r.clock())
			} else if pl, err = VerifyJWT(v, src, r.clock()); err == nil && r.rec != nil {
				exp = expOf(pl) // for holdsUntil, which only a plan cache reads
			}
			if err != nil {
				// A token refused now may pass later (its nbf), and the
				// error is reported with each request.
				r.readsTime()
				plan.JWTError = err
				continue
			}
			r.holdsUntil(exp, src.LeewaySec)
			if user, ok := Claim(pl, src.Claim); ok {
				id.User, payload, plan.IdentitySource = user, pl, "jwt"
			}
		case SourceJWTPayload:
			pl, err := DecodeJWTPayload(v)
			if err != nil {
				continue
			}
			if user, ok := Claim(pl, src.Claim); ok {
				id.User, payload, plan.IdentitySource = user, pl, "jwt_payload"
			}
		case SourceHeader:
			if len(v) <= maxUserIDLen {
				id.User, plan.IdentitySource = v, "header"
			}
		case SourcePeerCertificate:
			if len(v) <= maxUserIDLen {
				id.User, plan.IdentitySource = v, "peer_certificate"
			}
		case SourceQuery:
			if len(v) <= maxUserIDLen {
				id.User, plan.IdentitySource = v, "query"
			}
		}
		if id.User != "" {
			break
		}
	}
	if c.Identity.APIKeyHeader != "" {
		id.APIKey = r.header(c.Identity.APIKeyHeader)
	}
	if id.APIKey == "" && c.Identity.APIKeyQuery != "" {
		id.APIKey = plan.queryParam(r, c.Identity.APIKeyQuery)
	}
	if c.Identity.TenantHeader != "" {
		id.Tenant = r.header(c.Identity.TenantHeader)
	}
	id.Tier = c.Tiers.Default
	if len(c.Tiers.List) == 0 {
		return
	}
	var named string
	if c.Tiers.Claim != "" && payload != nil {
		named, _ = Claim(payload, c.Tiers.Claim)
	} else if c.Tiers.Header != "" {
		named = r.header(c.Tiers.Header)
	}
	if named != "" && c.Tiers.Find(named) != nil {
		id.Tier = named
	}
}

// maxUserIDLen bounds a user id taken from a header; a longer one is no
// identity (the request is anonymous).
const maxUserIDLen = 255

func (c *Config) exempt(id *Identity) bool {
	if id.IP.IsValid() {
		for _, p := range c.Exemptions.IPs {
			if p.Contains(id.IP) {
				return true
			}
		}
	}
	if id.User != "" {
		for _, u := range c.Exemptions.Users {
			if u == id.User {
				return true
			}
		}
	}
	return false
}

func (m *Match) matches(r *Request, path string) bool {
	if len(m.Paths) > 0 && !anyPathMatches(m.Paths, path) {
		return false
	}
	if len(m.Methods) > 0 {
		ok := false
		method := r.method()
		for _, meth := range m.Methods {
			if meth == method {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.Hosts) > 0 {
		ok := false
		reqHost := r.host()
		for _, host := range m.Hosts {
			if MatchHost(host, reqHost) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for i := range m.Headers {
		if hm := &m.Headers[i]; hm.holds(r.header(hm.Name)) == hm.Invert {
			return false
		}
	}
	for i := range m.Query {
		if qm := &m.Query[i]; queryHolds(r.Path, qm) == qm.Invert {
			return false
		}
	}
	return true
}

// setKeyNames fixes the counter names of tier limits: "tier.free" for the
// tier, "tier.free.0", ... for its endpoint overrides in config order;
// and, under those names, the heads of their checks.
func (t *TierConfig) setKeyNames() {
	for i := range t.List {
		tier := &t.List[i]
		tier.keyName = "tier." + tier.Name
		logOnly, perUser := tier.Action == LogOnly, tier.Scope.Has(ScopeUser)
		if !tier.Unlimited {
			tier.head = newPlannedHead(tier.keyName, &tier.Spec, logOnly, perUser, tier.OnResponse)
		}
		for j := range tier.Endpoints {
			ep := &tier.Endpoints[j]
			ep.keyName = tier.keyName + "." + strconv.Itoa(j)
			ep.head = newPlannedHead(ep.keyName, &ep.Spec, logOnly, perUser, tier.OnResponse)
		}
	}
}
