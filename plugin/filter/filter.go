// Package filter is Sluice's HTTP filter: the logic of the proxy-wasm
// plugin, in plain Go so that it runs natively in unit tests as well as in
// the built .wasm (plugin/main.go only adapts Host to the ABI binding).
//
// Per request it resolves the client, matches limits (rules.Config.Evaluate),
// answers 429 at once when a limit is known to be over (a cache in shared
// data, seen by every worker VM), and otherwise asks the bridge in one
// call-out for all limits together. Configuration is parsed once, in
// OnPluginStart; an invalid one is refused there and the previous stays.
package filter

import (
	"io"
	"strconv"
	"unsafe"

	"github.com/sluicehq/sluice/plugin/internal/idmap"
	"github.com/sluicehq/sluice/plugin/proxywasm"
	"github.com/sluicehq/sluice/rules"
)

// Host is what the filter needs from the proxy. Byte slices and strings it
// returns are views valid only during the current callback.
type Host interface {
	PluginConfig() ([]byte, error)
	// RequestHeaders gives the headers of the request whose callback is
	// in progress, whenever they are read: the plugin asks for it once.
	RequestHeaders() rules.HeaderSource
	// RequestPseudoHeaders is the :method, :path and :authority headers,
	// which every request reads, in one call.
	RequestPseudoHeaders() (method, path, authority string)
	// RequestPath is the :path header, for a request that may need no
	// other header: without reading the others.
	RequestPath() string
	// RemoveRequestHeader removes a header of the request whose headers
	// callback is in progress, before it goes upstream.
	RemoveRequestHeader(name string)
	// ResponseHeader is a header of the response whose headers callback
	// is in progress, "" when it has none.
	ResponseHeader(name string) string
	// ReadResponseBody writes the first size bytes of the response body
	// of the body callback in progress to w, in parts.
	ReadResponseBody(size int, w io.Writer)
	Property(path string) string
	AddResponseHeader(name string, value []byte)
	// SendLocalResponse answers stream contextID's request; headers is a
	// serialized header map (proxywasm.AppendHeaderMap). They are all the
	// filter gives the reply, so the stream's response headers are
	// skipped, as after SkipResponseHeaders.
	SendLocalResponse(contextID, status uint32, headers []byte, body []byte)
	// SkipResponseHeaders tells the host that stream contextID has no
	// header to add to its response (proxywasm.SkipResponseHeaders).
	SkipResponseHeaders(contextID uint32)
	ResumeRequest()
	// Dispatch sends an HTTP call-out; its answer comes to OnHTTPCallResponse.
	Dispatch(cluster string, headers [][2]string, body []byte, timeoutMS uint32) (uint32, error)
	// CallResponse returns the :status and body of the call-out being answered.
	CallResponse(bodySize int) (status string, body []byte)
	SetEffectiveContext(contextID uint32)
	// SharedGetCAS returns the value shared by every VM under key (nil
	// when there is none) and its CAS token; SharedSetCAS stores value
	// unless another write came since the token was read (false).
	SharedGetCAS(key string) ([]byte, uint32)
	SharedSetCAS(key string, value []byte, cas uint32) bool
	NowNanos() int64
	Log(level proxywasm.LogLevel, msg []byte)
	DefineCounter(name string) uint32
	IncCounter(id uint32)
	AddCounter(id uint32, n int64)
	// A gauge, summed over the proxy's VMs (each adds and takes back its
	// own), and a histogram of values.
	DefineGauge(name string) uint32
	AddGauge(id uint32, n int64)
	DefineHistogram(name string) uint32
	Record(id uint32, v int64)
	// LogLevel is the host's log level; SetTickPeriod starts OnTick calls.
	LogLevel() proxywasm.LogLevel
	SetTickPeriod(ms uint32)
	// Env looks up an environment variable of the VM (what the proxy
	// passes, such as Envoy's vm_config.environment_variables).
	Env(name string) (string, bool)
}

// Metric names, as the proxy exports them (Envoy prefixes wasmcustom.).
const (
	MetricRequests      = "sluice_requests_total"
	MetricAllowed       = "sluice_allowed_total"
	MetricDenied        = "sluice_denied_total"
	MetricLogOnlyDenied = "sluice_log_only_denied_total"
	MetricBridgeErrors  = "sluice_bridge_errors_total"
	MetricFailOpen      = "sluice_fail_open_total"
	MetricFailClosed    = "sluice_fail_closed_total"
	MetricPanics        = "sluice_panics_total"
	MetricCacheHits     = "sluice_local_cache_hits_total"
	MetricExempt        = "sluice_exempt_total"
	MetricConfigRefused = "sluice_config_refused_total"
	MetricPolicyApplied = "sluice_policy_applied_total"
	MetricPolicyRefused = "sluice_policy_refused_total"
	MetricPolicyErrors  = "sluice_policy_fetch_errors_total"
	// Leases (lease.go): requests answered from one, grants received,
	// renewals sent in the background, and units granted, spent, handed
	// back and not handed back (lost, or maybe lost: they come back when
	// the store's window or lease generation ends).
	MetricLeaseHits       = "sluice_lease_hits_total"
	MetricLeaseGrants     = "sluice_lease_grants_total"
	MetricLeaseRenewals   = "sluice_lease_renewals_total"
	MetricUnitsGranted    = "sluice_lease_units_granted_total"
	MetricUnitsSpent      = "sluice_lease_units_spent_total"
	MetricUnitsReturned   = "sluice_lease_units_returned_total"
	MetricUnitsUnreturned = "sluice_lease_units_unreturned_total"
	// Throttle limits (throttle.go): requests held and for how long (in
	// total and as a histogram, ms), requests held now, and refusals
	// because the wait would exceed max_delay or every place was taken.
	MetricThrottled       = "sluice_throttled_total"
	MetricThrottleDelayMS = "sluice_throttle_delay_ms_total"
	MetricThrottleDelay   = "sluice_throttle_delay_ms"
	MetricThrottleWaiting = "sluice_throttle_waiting"
	MetricThrottleTooLong = "sluice_throttle_too_long_total"
	MetricThrottleFull    = "sluice_throttle_full_total"
	// Limits charged after the response (charge.go): the call-outs that
	// charged them, those the bridge did not take, and the responses
	// whose body did not say what they cost.
	MetricCharges      = "sluice_charges_total"
	MetricChargeErrors = "sluice_charge_errors_total"
	MetricBodyUnread   = "sluice_charge_body_unread_total"
)

// tokenCacheSlots bounds the verified-token cache of one VM (at most 2 KiB
// tokens, so well under a megabyte).
const tokenCacheSlots = 256

type metrics struct {
	requests, allowed, denied, logOnlyDenied, bridgeErrors, failOpen, failClosed, cacheHits, exempt, configRefused, panics uint32
	policyApplied, policyRefused, policyErrors                                                                             uint32
	leaseHits, leaseGrants, leaseRenewals, unitsGranted, unitsSpent, unitsReturned, unitsUnreturned                        uint32
	throttled, throttleDelayMS, throttleDelay, throttleWaiting, throttleTooLong, throttleFull                              uint32
	charges, chargeErrors, bodyUnread                                                                                      uint32
}

// Plugin is the root context of one VM.
type Plugin struct {
	host Host
	// headers is host.RequestHeaders().
	headers rules.HeaderSource
	id      uint32
	cfg     *rules.Config
	// bridgeAuth is the call-out's Authorization value, built once per config.
	bridgeAuth string
	// tokens caches verified JWTs for this VM; new with each config, since
	// its entries belong to that config's identity sources.
	tokens *rules.TokenCache
	m      metrics
	// debug: the host logs debug messages, so allowed requests get an
	// event too. Refreshed every tick rather than asked per request.
	debug   bool
	policy  policyState         // rules from the bridge (policy.go)
	pending idmap.Map[*Stream]  // call-out id → waiting stream
	charges idmap.Map[struct{}] // call-out ids of the charges in flight (charge.go)
	free    []*Stream           // recycled streams: no allocation per request
	// answering is the stream whose bridge answer is being handled, so
	// that a panic in the root context's call-out callback answers it.
	answering *Stream
	// testPanics: requests may ask for a panic (see testPanicHeader).
	testPanics bool
	refusals   [refusalSlots]refusal
	// plans: the plans of refused requests, so that a client refused
	// again and again is not evaluated again and again.
	plans rules.PlanCache
	// unmatched is the share of recent requests no limit applied to, in
	// 1/shareOne, a moving average over about 32 of them. Above
	// pathFirstShare a request's path alone is looked at before its other
	// headers are read (Stream.OnRequestHeaders).
	unmatched int
	// uncounted is how many requests refuseAgain answered that the
	// requests, denied and local cache hits counters do not count yet:
	// they are added once a tick (countDeferred).
	uncounted int64
	// unlimited is how many requests no limit applied to that the
	// requests counter does not count yet (countDeferred).
	unlimited int64
	// Leases (lease.go): renewals and returns in flight, leases this VM
	// installed, and scratch for changing slots.
	leaseCalls    [leaseCallSlots]leaseCall
	leaseInFlight int
	tracked       [trackedSlots]trackedLease
	trackNext     int
	leaseResp     rules.CheckResponse
	leaseBody     []byte
	leaseHdrs     [][2]string
	entry         slotEntry
	slotKey       []byte
	slotBuf       []byte
	evicted       []byte
	evictedSpec   rules.LimitSpec
	thr           throttleState // requests held for their slot (throttle.go)
	// basePeriod is the tick's period when no request is held.
	basePeriod uint32
	// Shared scratch for one callback at a time (a VM is single-threaded).
	scratch []byte
	event   []byte
}

// NewPlugin creates the root context contextID.
func NewPlugin(host Host, contextID uint32) *Plugin {
	p := &Plugin{host: host, headers: host.RequestHeaders(), id: contextID}
	p.m = metrics{
		requests: host.DefineCounter(MetricRequests), allowed: host.DefineCounter(MetricAllowed),
		denied: host.DefineCounter(MetricDenied), logOnlyDenied: host.DefineCounter(MetricLogOnlyDenied),
		bridgeErrors: host.DefineCounter(MetricBridgeErrors), failOpen: host.DefineCounter(MetricFailOpen),
		failClosed: host.DefineCounter(MetricFailClosed), cacheHits: host.DefineCounter(MetricCacheHits),
		exempt: host.DefineCounter(MetricExempt), configRefused: host.DefineCounter(MetricConfigRefused),
		panics:        host.DefineCounter(MetricPanics),
		policyApplied: host.DefineCounter(MetricPolicyApplied), policyRefused: host.DefineCounter(MetricPolicyRefused),
		policyErrors: host.DefineCounter(MetricPolicyErrors),
		leaseHits:    host.DefineCounter(MetricLeaseHits), leaseGrants: host.DefineCounter(MetricLeaseGrants),
		leaseRenewals: host.DefineCounter(MetricLeaseRenewals),
		unitsGranted:  host.DefineCounter(MetricUnitsGranted), unitsSpent: host.DefineCounter(MetricUnitsSpent),
		unitsReturned: host.DefineCounter(MetricUnitsReturned), unitsUnreturned: host.DefineCounter(MetricUnitsUnreturned),
		throttled: host.DefineCounter(MetricThrottled), throttleDelayMS: host.DefineCounter(MetricThrottleDelayMS),
		throttleDelay: host.DefineHistogram(MetricThrottleDelay), throttleWaiting: host.DefineGauge(MetricThrottleWaiting),
		throttleTooLong: host.DefineCounter(MetricThrottleTooLong), throttleFull: host.DefineCounter(MetricThrottleFull),
		charges: host.DefineCounter(MetricCharges), chargeErrors: host.DefineCounter(MetricChargeErrors),
		bodyUnread: host.DefineCounter(MetricBodyUnread),
	}
	return p
}

// Config returns the configuration in force, nil before the first valid one.
func (p *Plugin) Config() *rules.Config { return p.cfg }

// OnPluginStart parses the configuration. An invalid one is logged with its
// field path and refused; the previous configuration stays in force.
func (p *Plugin) OnPluginStart(int) bool {
	data, err := p.host.PluginConfig()
	if err != nil {
		p.logf(proxywasm.LogLevelError, "sluice: reading the plugin configuration: ", err.Error())
		p.host.IncCounter(p.m.configRefused)
		return false
	}
	cfg, err := rules.ParseConfigEnv(data, p.host.Env)
	if err != nil {
		p.logf(proxywasm.LogLevelError, "sluice: configuration refused: ", err.Error())
		p.host.IncCounter(p.m.configRefused)
		return false
	}
	p.cfg = cfg
	p.tokens = rules.NewTokenCache(tokenCacheSlots)
	v, _ := p.host.Env(testPanicEnv)
	p.testPanics = v == "1"
	p.bridgeAuth = ""
	if cfg.Bridge.Token != "" {
		p.bridgeAuth = "Bearer " + cfg.Bridge.Token
	}
	p.logf(proxywasm.LogLevelInfo, "sluice: configuration loaded, failure mode ", cfg.FailureMode.String())
	p.followLogLevel()
	p.startPolicy(cfg)
	now := p.host.NowNanos() / 1e6
	p.basePeriod = tickPeriod(cfg)
	p.thr.slowAt = now + int64(p.basePeriod)
	p.scheduleTick(now)
	return true
}

// OnPluginDone counts what is not counted yet (countDeferred): the VM is
// going away.
func (p *Plugin) OnPluginDone() bool {
	p.countDeferred()
	return true
}

// The panic trigger for tests of the recovery below, through the built
// module: with the VM environment variable SLUICE_TEST_PANIC=1, a request
// with the header x-sluice-test-panic: request panics while its headers are
// handled, and with "callout" while its bridge answer is. Only a proxy's VM
// environment can turn it on (Envoy passes a VM only the variables its
// vm_config lists); no plugin configuration field reaches it.
const (
	testPanicEnv    = "SLUICE_TEST_PANIC"
	testPanicHeader = "x-sluice-test-panic"
)

// OnPanic answers for a callback that panicked (the binding has logged the
// panic and its stack): it counts the panic and answers the request
// concerned by the failure mode, as a bridge failure would be, so the VM
// keeps serving. The rest of the request is left alone: the stream may be
// half-way through any step, and the next request starts afresh.
func (p *Plugin) OnPanic(_ uint32, ctx proxywasm.HTTPContext, _ any) proxywasm.Action {
	p.host.IncCounter(p.m.panics)
	s, inStream := ctx.(*Stream)
	if !inStream {
		s, p.answering = p.answering, nil
	}
	if s == nil || s.cfg == nil || s.answered {
		return proxywasm.Continue
	}
	p.forget(s)
	s.releasePlace()
	s.state = stateDone
	if !inStream {
		p.host.SetEffectiveContext(s.id)
	}
	if s.cfg.FailureMode == rules.FailClosed {
		s.body = rules.AppendUnavailableBody(s.body[:0], "plugin error", bytesString(s.requestID))
		s.sendLocal(s.cfg.Deny.FailClosedStatus, jsonHeaders, s.body)
		return proxywasm.Pause
	}
	if !inStream {
		s.answered = true
		p.host.ResumeRequest()
	}
	return proxywasm.Continue
}

// OnTick counts what is not counted yet (countDeferred) and resumes
// the held requests that are due. Once a period (the tick fires more often
// while requests are held) it follows the host's log level, reports the
// refusals from the over-limit cache that no later refusal has reported,
// forgets the plans of refusals that stopped, hands back what leases that
// ended still hold, and asks the bridge for its policy (rules_from).
func (p *Plugin) OnTick() {
	now := p.host.NowNanos() / 1e6
	p.countDeferred()
	p.throttleTick(now)
	if now >= p.thr.slowAt {
		p.thr.slowAt = now + int64(p.basePeriod)
		p.followLogLevel()
		p.reportAllRefusals(now)
		p.plans.Sweep()
		p.leaseTick(now)
		p.policyTick()
	}
	p.scheduleTick(now)
}

func (p *Plugin) followLogLevel() { p.debug = p.host.LogLevel() <= proxywasm.LogLevelDebug }

// NewHTTPContext returns a recycled stream when one is free.
func (p *Plugin) NewHTTPContext(contextID uint32) proxywasm.HTTPContext {
	var s *Stream
	if n := len(p.free); n > 0 {
		s = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		s = &Stream{p: p}
	}
	s.id = contextID
	s.cfg = p.cfg
	s.state = stateNew
	s.answered = false
	s.heldAt, s.holdsPlace, s.noWait = -1, false, false
	s.charges, s.bodies = false, s.bodies[:0]
	s.testPanicInCallout = false
	s.requestID = s.requestID[:0]
	s.respHeaders.Reset()
	return s
}

// appendCallHeaders appends the headers of a call-out to the bridge b,
// for the request requestID ("" for none).
func (p *Plugin) appendCallHeaders(dst [][2]string, b *rules.Bridge, requestID string) [][2]string {
	dst = append(dst, [2]string{":method", "POST"}, [2]string{":path", b.Path}, [2]string{":authority", b.Authority},
		[2]string{"content-type", "application/json"})
	if requestID != "" {
		dst = append(dst, [2]string{"x-request-id", requestID})
	}
	if p.bridgeAuth != "" {
		dst = append(dst, [2]string{"authorization", p.bridgeAuth})
	}
	return dst
}

func (p *Plugin) logf(level proxywasm.LogLevel, parts ...string) {
	b := p.scratch[:0]
	for _, s := range parts {
		b = append(b, s...)
	}
	p.scratch = b
	p.host.Log(level, b)
}

// bytesString views b as a string without copying; b must not change while
// the string is in use.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func itoa(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// jsonHeaders are the headers of a local reply with a JSON body and nothing
// else to say, serialized.
var jsonHeaders = proxywasm.AppendHeaderMap(nil, [][2]string{{"content-type", "application/json"}})
