package rules

import (
	"net/netip"
	"strings"
)

// Algorithm names a limit algorithm. Its string form is the config and wire value.
type Algorithm uint8

const (
	TokenBucket   Algorithm = iota + 1 // HASH of tokens and last refill; burst is the capacity
	SlidingWindow                      // weighted counter over the current and previous window
	SlidingLog                         // ZSET of admitted requests, exact, capped at the limit
	FixedWindow                        // counter per aligned window
)

var algorithmNames = [...]string{"", "token_bucket", "sliding_window", "sliding_log", "fixed_window"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return ""
}

// ParseAlgorithm returns the algorithm with the given config name.
func ParseAlgorithm(s string) (Algorithm, bool) {
	for i := 1; i < len(algorithmNames); i++ {
		if algorithmNames[i] == s {
			return Algorithm(i), true
		}
	}
	return 0, false
}

// Action is what happens when a limit denies a request.
type Action uint8

const (
	Reject  Action = iota + 1 // answer 429
	LogOnly                   // log and count a denial, let the request pass
	// Throttle holds a request in the proxy until the limit lets it
	// through, reserving its slot when it is decided, and answers 429
	// only when the wait would exceed the limit's max_delay.
	Throttle
)

func (a Action) String() string {
	switch a {
	case Reject:
		return "reject"
	case LogOnly:
		return "log_only"
	case Throttle:
		return "throttle"
	}
	return ""
}

// FailureMode is the answer when the bridge cannot decide.
type FailureMode uint8

const (
	FailOpen   FailureMode = iota + 1 // let requests pass, counted and logged
	FailClosed                        // refuse requests with 503 SERVICE_UNAVAILABLE
)

func (f FailureMode) String() string {
	if f == FailClosed {
		return "fail_closed"
	}
	return "fail_open"
}

// ScopePart is one dimension a counter is kept per.
type ScopePart uint8

const (
	ScopeGlobal   ScopePart = 1 << iota // one counter for everyone
	ScopeIP                             // per client IP
	ScopeUser                           // per user id (JWT claim or user header)
	ScopeAPIKey                         // per API key
	ScopeTenant                         // per tenant
	ScopeEndpoint                       // per request path (combined with another part)
	ScopeMethod                         // per request method (combined with another part)
)

// Scope is a set of parts, written in config as "user+endpoint".
type Scope uint8

var scopePartNames = [...]struct {
	part ScopePart
	name string
}{
	{ScopeGlobal, "global"}, {ScopeIP, "ip"}, {ScopeUser, "user"}, {ScopeAPIKey, "api_key"},
	{ScopeTenant, "tenant"}, {ScopeEndpoint, "endpoint"}, {ScopeMethod, "method"},
}

// Has reports whether s includes p.
func (s Scope) Has(p ScopePart) bool { return uint8(s)&uint8(p) != 0 }

func (s Scope) String() string {
	out := ""
	for _, n := range scopePartNames {
		if s.Has(n.part) {
			if out != "" {
				out += "+"
			}
			out += n.name
		}
	}
	return out
}

// Config is a validated plugin configuration. Build it with ParseConfig.
type Config struct {
	Enabled     bool
	FailureMode FailureMode
	Bridge      Bridge
	Identity    IdentityConfig
	Tiers       TierConfig
	Categories  []Category
	Rules       []Rule
	RulesFrom   *RulesFrom // nil: rules from the configuration only
	Exemptions  Exemptions
	Penalty     Penalty // defaults for every limit; a rule may override
	Headers     HeaderConfig
	Deny        DenyConfig
	LocalCache  LocalCacheConfig
	Throttle    ThrottleConfig
}

// ThrottleConfig bounds what throttle limits hold in one proxy VM.
type ThrottleConfig struct {
	// MaxWaiting is how many requests one VM holds at once; a throttled
	// request that finds them all taken is decided as if it could not
	// wait (429 unless it can pass at once), consuming nothing.
	MaxWaiting int64
}

// Throttle bounds. A held request waits in the proxy, not in the bridge:
// the bound is the proxy's stream timeouts (Envoy's stream_idle_timeout
// is 5 minutes by default, its request_timeout off), which must exceed
// max_delay; half a minute keeps a held client well inside them.
const (
	DefaultMaxDelayMS  = 1000
	MaxMaxDelayMS      = 30_000
	DefaultMaxWaiting  = 1000
	MaxMaxWaitingPerVM = 100_000
)

// Bridge is where the plugin sends check requests.
type Bridge struct {
	Cluster   string // upstream cluster name known to the proxy
	Authority string // :authority of the call-out
	Path      string // default /v1/rate-limit/check
	TimeoutMS uint32 // call-out timeout, default 200
	Token     string // sent as Authorization: Bearer when set
}

// IdentityConfig says how a client is identified.
type IdentityConfig struct {
	// Sources are tried in order for the user id; the first that yields one wins.
	Sources []IdentitySource
	// APIKeyHeader, TenantHeader name headers carrying those identities ("" = unused).
	APIKeyHeader string
	TenantHeader string
	// APIKeyQuery names a query parameter carrying the API key, for a
	// request without APIKeyHeader ("" = unused).
	APIKeyQuery string
	ClientIP    ClientIPConfig
	// Anonymous says what a user-scoped limit keys on when no user is known:
	// AnonymousIP (default) counts by client IP, AnonymousShared puts all
	// anonymous clients in one counter.
	Anonymous AnonymousMode
}

// AnonymousMode is the fallback identity for user-scoped limits.
type AnonymousMode uint8

const (
	AnonymousIP AnonymousMode = iota + 1
	AnonymousShared
)

// SourceKind is the kind of an identity source.
type SourceKind uint8

const (
	// SourceJWT verifies a bearer token in the plugin with the configured keys.
	SourceJWT SourceKind = iota + 1
	// SourceJWTPayload reads a claim from a header that a verifying filter
	// (Envoy jwt_authn forward_payload_header) set: base64url JSON payload.
	SourceJWTPayload
	// SourceHeader takes the header value as the user id, trusted as set by
	// an upstream authenticating filter.
	SourceHeader
	// SourcePeerCertificate takes a name of the client certificate the
	// proxy verified (mutual TLS): its first URI (a SPIFFE id, as Istio's
	// sidecars present), or with PeerDNS its first DNS name; Envoy's
	// connection.uri_san_peer_certificate, dns_san_peer_certificate.
	SourcePeerCertificate
	// SourceQuery takes a query parameter's value, decoded, as the user
	// id, trusted as an API's own key that the application checks.
	SourceQuery
)

// IdentitySource is one way to find the user id.
type IdentitySource struct {
	Kind   SourceKind
	Header string // lower-case header name; "authorization" for SourceJWT by default
	Param  string // the query parameter's name, decoded: SourceQuery's; SourceJWT's in place of Header
	Claim  string // claim holding the user id (SourceJWT, SourceJWTPayload), default "sub"
	// PeerDNS: SourcePeerCertificate takes the DNS name, not the URI.
	PeerDNS bool
	// For SourceJWT only:
	Keys      []JWTKey
	Issuer    string   // required iss when set
	Audiences []string // aud must contain one of these when set
	LeewaySec int64    // clock skew allowed on exp/nbf, default 30
	// RequireExp refuses tokens without exp (default true): a token that
	// never expires would identify its holder forever once leaked.
	RequireExp bool
}

// JWTKey is one verification key.
type JWTKey struct {
	ID  string // kid; "" matches any token kid
	Alg string // HS256, RS256 or ES256
	// Exactly one of: Secret (HS256), PublicKey (RS256/ES256, from PEM).
	Secret    []byte
	PublicKey any // *rsa.PublicKey or *ecdsa.PublicKey
}

// ClientIPConfig says which address is the client's.
type ClientIPConfig struct {
	// TrustedProxyDepth is how many X-Forwarded-For entries, counted from the
	// right, were appended by proxies we trust. 0 ignores X-Forwarded-For.
	TrustedProxyDepth int
	// TrustedProxies: when set, X-Forwarded-For is walked from the right,
	// skipping addresses inside these prefixes; the first other one is the
	// client. Used instead of the depth when non-empty.
	TrustedProxies []netip.Prefix
	// UseXRealIP takes X-Real-IP when X-Forwarded-For yields nothing.
	UseXRealIP bool
}

// TierConfig holds plans such as free/premium and where a client's plan is read.
type TierConfig struct {
	Header  string // lower-case header carrying the tier name, or
	Claim   string // claim of the verified JWT carrying it (preferred when both set)
	Default string // tier for clients that name none or an unknown one
	List    []Tier
}

// Tier is a plan's limit, with per-endpoint overrides.
type Tier struct {
	Name      string
	Unlimited bool // no tier limit at all
	Spec      LimitSpec
	Scope     Scope // default user
	Endpoints []EndpointOverride
	Action    Action // for the tier limit and its endpoint overrides
	// MaxDelayMS is how long a throttle limit may hold a request.
	MaxDelayMS int64
	// OnResponse, when set, charges the tier limit and its endpoint
	// overrides after the response (charge.go).
	OnResponse *OnResponse

	keyName string     // "tier.<name>"
	head    *limitHead // the start of its checks (setKeyNames)
}

// EndpointOverride replaces the tier limit for matching requests.
type EndpointOverride struct {
	Match PathPattern
	Spec  LimitSpec

	keyName string     // "tier.<name>.<index>"
	head    *limitHead // the start of its checks (setKeyNames)
}

// Category groups endpoints under one limit (chat, upload, auth).
type Category struct {
	Name   string
	Paths  []PathPattern
	Spec   LimitSpec
	Scope  Scope
	Action Action
	// MaxDelayMS is how long a throttle limit may hold a request.
	MaxDelayMS int64

	head *limitHead // the start of its checks, set by the parser
}

// Rule is an explicit limit for matching requests.
type Rule struct {
	Name     string
	Match    Match
	Scope    Scope
	Spec     LimitSpec
	Action   Action
	Priority int // lower first; equal priorities keep config order
	Enabled  bool
	// MaxDelayMS is how long a throttle limit may hold a request.
	MaxDelayMS int64
	// OnResponse, when set, charges the limit after the response
	// (charge.go); nil: before the request, as every other limit.
	OnResponse *OnResponse

	head *limitHead // the start of its checks, set by the parser
}

// LimitSpec is how much may pass.
type LimitSpec struct {
	Algorithm Algorithm // default sliding_window
	Limit     int64     // requests (or cost units) per window, > 0
	WindowMS  int64     // window length in milliseconds, > 0
	Burst     int64     // token bucket capacity, default Limit
	Cost      int64     // weight of one request, default 1
	Penalty   *Penalty  // nil: none
	Lease     Lease     // zero: never leased
	// Months, when > 0, makes a fixed_window's windows calendar months
	// (UTC): each starts on the 1st of a month, every Months months
	// from January (ValidMonths). WindowMS is then Months × MonthMS.
	Months int64
}

// Lease lets a proxy hold part of a limit's quota and spend it without a
// call-out (docs/config.md, lease). The bridge deducts the units in the
// call that grants them; units a proxy did not spend go back when the
// lease expires.
type Lease struct {
	Size  int64 // units a grant holds at most; 0: the limit is never leased
	TTLMS int64 // how long a proxy may spend a grant
}

// Penalty lengthens the block of clients that keep violating a limit.
type Penalty struct {
	Enabled            bool
	DetectionWindowMS  int64   // violations older than this are forgotten, default 1h
	ViolationThreshold int64   // violations before the first penalty, default 3
	Multipliers        []int64 // block = window × multiplier, escalating, default 1,2,4,8
}

// Match selects requests for a rule. Empty fields match everything.
type Match struct {
	Paths   []PathPattern
	Methods []string // upper-case
	Hosts   []string // lower-case, exact or "*.example.com"
	Headers []FieldMatch
	Query   []FieldMatch // on the path's query parameters (queryHolds)
}

// PatternKind is how a path pattern compares.
type PatternKind uint8

const (
	PatternExact   PatternKind = iota + 1 // "/api/v1/login"
	PatternPrefix                         // "/api/" with kind prefix, or "/api/*" style written as prefix:
	PatternGlob                           // "*" one segment (or part of one), "**" any number of segments
	PatternSubtree                        // "/api/**": a glob that is a path and everything below it
)

// PathPattern is a compiled path pattern.
type PathPattern struct {
	Kind PatternKind
	Raw  string   // as written in config
	Text string   // exact path or prefix
	Segs []string // glob segments
}

// FieldMatch is a condition on a header or a query parameter: that it is
// present (with a value), or that its value equals, starts with, ends
// with or contains a text.
type FieldMatch struct {
	Name   string  // a header's lower-case; a query parameter's decoded
	Op     FieldOp // how the value compares
	Value  string  // what Op compares with; "" for FieldPresent
	Invert bool    // match when the condition does not hold
}

// FieldOp is how a FieldMatch compares a value.
type FieldOp uint8

const (
	FieldPresent  FieldOp = iota + 1 // a non-empty value
	FieldEquals                      // the value is Value
	FieldPrefix                      // the value starts with Value
	FieldSuffix                      // the value ends with Value
	FieldContains                    // Value is in the value
)

// fieldOps are the configuration's names of the ops, in FieldOp order.
var fieldOps = [...]string{FieldPresent: "present", FieldEquals: "equals", FieldPrefix: "prefix", FieldSuffix: "suffix", FieldContains: "contains"}

// String is the op's name in the configuration.
func (o FieldOp) String() string {
	if int(o) < len(fieldOps) && o != 0 {
		return fieldOps[o]
	}
	return "invalid"
}

// holds reports whether v, a header's or a query parameter's value ("" for
// none), passes m's comparison, before Invert.
func (m *FieldMatch) holds(v string) bool {
	switch m.Op {
	case FieldPresent:
		return v != ""
	case FieldEquals:
		return v == m.Value
	case FieldPrefix:
		return strings.HasPrefix(v, m.Value)
	case FieldSuffix:
		return strings.HasSuffix(v, m.Value)
	case FieldContains:
		return strings.Contains(v, m.Value)
	}
	return false
}

// Exemptions are never limited.
type Exemptions struct {
	IPs   []netip.Prefix // single addresses as /32 or /128
	Users []string
}

// HeaderConfig controls the response headers the plugin writes.
type HeaderConfig struct {
	Prefix     string // default "X-RateLimit-"
	Strategy   bool   // X-RateLimit-Strategy
	Draft      bool   // IETF draft-11 RateLimit and RateLimit-Policy
	RetryAfter bool   // Retry-After on 429, default true
	Disabled   bool   // no rate limit headers at all

	// Header names with the prefix applied, built once at parse time so
	// rendering does not concatenate per request.
	limitName, remainingName, resetName, strategyName, delayName string
}

// DenyConfig shapes the 429 answer.
type DenyConfig struct {
	Status  uint32 // default 429
	Message string // default: "Rate limit exceeded: N requests per W allowed."
	// FailClosedStatus is the status when the bridge cannot decide in fail_closed, default 503.
	FailClosedStatus uint32
}

// LocalCacheConfig bounds the plugin's over-limit cache.
type LocalCacheConfig struct {
	Enabled    bool  // default true
	MaxEntries int64 // default 10000
	// MaxHoldMS bounds how long a denial is answered from the cache
	// before the bridge is asked again, default a minute: a limit raised,
	// a counter reset or an override set at the bridge then takes effect
	// within it, though the denial's retry time be weeks away.
	MaxHoldMS int64
}

// ShortestLeaseTTLMS is the shortest lease ttl of any limit of c, 0 when
// none is leased.
func (c *Config) ShortestLeaseTTLMS() int64 {
	var least int64
	note := func(s *LimitSpec) {
		if s.Lease.Size > 0 && (least == 0 || s.Lease.TTLMS < least) {
			least = s.Lease.TTLMS
		}
	}
	for i := range c.Rules {
		note(&c.Rules[i].Spec)
	}
	for i := range c.Categories {
		note(&c.Categories[i].Spec)
	}
	for i := range c.Tiers.List {
		t := &c.Tiers.List[i]
		note(&t.Spec)
		for j := range t.Endpoints {
			note(&t.Endpoints[j].Spec)
		}
	}
	return least
}
