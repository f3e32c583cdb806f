package redisbridge

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/rules"
)

type metrics struct {
	reg         *prometheus.Registry
	checks      *prometheus.CounterVec   // by result
	decisions   *prometheus.CounterVec   // by result, algorithm, rule
	nearLimit   *prometheus.CounterVec   // allowed decisions near their limit, by algorithm, rule
	checkDur    prometheus.Histogram     // whole check, as the HTTP handler sees it
	storeDur    *prometheus.HistogramVec // by op
	storeErrors *prometheus.CounterVec   // by op
	adminOps    *prometheus.CounterVec   // by action, result
	idemReplays prometheus.Counter       // batch-check answers replayed for a repeated idempotency key
	leaseGrants prometheus.Counter       // leases granted
	leaseUnits  *prometheus.CounterVec   // by op: granted, returned
	leaseCalls  *prometheus.CounterVec   // checks that only renew or return leases, by op
	// rate limit service calls refused by the over-limit cache
	overLimitCacheHits prometheus.Counter
	// rate limit service configurations from --rls-xds, by result
	rlsConfigUpdates *prometheus.CounterVec

	// Children of the vectors the check path uses, looked up once: a
	// WithLabelValues per check costs label hashing and a lock.
	checkAllowed, checkDenied, checkError, checkInvalid prometheus.Counter
	checkThrottled                                      prometheus.Counter
	delays                                              prometheus.Histogram // delays of throttled checks
	storeCheck                                          prometheus.Observer
	unitsGranted, unitsReturned, renewals, returns      prometheus.Counter

	mu    sync.RWMutex
	rules map[string]struct{}                // rule label values seen, bounded
	dec   map[decisionKey]prometheus.Counter // decisions and nearLimit children by key, same bound
}

type decisionKey struct {
	result string // "": nearLimit's
	alg    rules.Algorithm
	rule   string
}

// maxRuleLabels bounds the rule label: rule names come from callers.
const maxRuleLabels = 500

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), rules: map[string]struct{}{}, dec: map[decisionKey]prometheus.Counter{}}
	m.checks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_checks_total", Help: "Check requests by result (allowed, throttled: allowed after a delay, denied, error, invalid).",
	}, []string{"result"})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_decisions_total", Help: "Limit decisions by result, algorithm and rule.",
	}, []string{"result", "algorithm", "rule"})
	m.nearLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_near_limit_total", Help: "Allowed decisions that left more than --near-limit-ratio of their limit used, by algorithm and rule.",
	}, []string{"algorithm", "rule"})
	m.checkDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_bridge_check_duration_seconds", Help: "Time to answer a check request.",
		// .15 and .2 are the default --redis-timeout and the plugin's default
		// bridge.timeout, so an alert on the p99 against them reads a bucket
		// boundary rather than an interpolation between .1 and .25.
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .15, .2, .25, 1},
	})
	m.storeDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_bridge_store_duration_seconds", Help: "Time spent in the counter store by operation.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	}, []string{"op"})
	m.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_store_errors_total", Help: "Counter store failures by operation.",
	}, []string{"op"})
	m.adminOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_admin_requests_total", Help: "Admin API requests by action and result.",
	}, []string{"action", "result"})
	m.idemReplays = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_bridge_idempotent_replays_total", Help: "Batch-check answers replayed for a repeated idempotency key.",
	})
	m.leaseGrants = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_bridge_lease_grants_total", Help: "Leases granted to proxies.",
	})
	m.leaseUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_lease_units_total", Help: "Lease units granted, and unspent units proxies handed back (op).",
	}, []string{"op"})
	m.leaseCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_lease_calls_total", Help: "Checks that only renew leases or hand units back, by op (renew, return).",
	}, []string{"op"})
	m.delays = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_bridge_throttle_delay_seconds", Help: "Delays of checks allowed after a delay (throttle limits).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.overLimitCacheHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_bridge_rls_over_limit_cache_hits_total", Help: "Rate limit service calls refused by the over-limit cache, without a store call.",
	})
	m.rlsConfigUpdates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_rls_xds_updates_total", Help: "Rate limit service configurations the --rls-xds server sent, by result (applied, refused).",
	}, []string{"result"})
	m.reg.MustRegister(m.checks, m.decisions, m.nearLimit, m.checkDur, m.storeDur, m.storeErrors, m.adminOps, m.idemReplays,
		m.leaseGrants, m.leaseUnits, m.leaseCalls, m.delays, m.overLimitCacheHits, m.rlsConfigUpdates,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.unitsGranted = m.leaseUnits.WithLabelValues("granted")
	m.unitsReturned = m.leaseUnits.WithLabelValues("returned")
	m.renewals = m.leaseCalls.WithLabelValues("renew")
	m.returns = m.leaseCalls.WithLabelValues("return")
	m.checkAllowed = m.checks.WithLabelValues("allowed")
	m.checkDenied = m.checks.WithLabelValues("denied")
	m.checkThrottled = m.checks.WithLabelValues("throttled")
	m.checkError = m.checks.WithLabelValues("error")
	m.checkInvalid = m.checks.WithLabelValues("invalid")
	m.storeCheck = m.storeDur.WithLabelValues("check")
	// Series exist at zero from the start, so rate() and increase() in
	// dashboards and alerts see the first error rather than a new series.
	for _, op := range []string{"check", "status", "config", "reset", "ping"} {
		m.storeErrors.WithLabelValues(op)
	}
	for _, r := range []string{"applied", "refused"} {
		m.rlsConfigUpdates.WithLabelValues(r)
	}
	return m
}

// decision returns the decisions counter for (result, alg, rule).
func (m *metrics) decision(result string, alg rules.Algorithm, rule string) prometheus.Counter {
	return m.ruleCounter(decisionKey{result, alg, rule})
}

// near returns the near-limit counter for (alg, rule).
func (m *metrics) near(alg rules.Algorithm, rule string) prometheus.Counter {
	return m.ruleCounter(decisionKey{"", alg, rule})
}

// ruleCounter returns the child of decisions or nearLimit for k, its rule
// label bounded by ruleLabel.
func (m *metrics) ruleCounter(k decisionKey) prometheus.Counter {
	m.mu.RLock()
	c, ok := m.dec[k]
	m.mu.RUnlock()
	if ok {
		return c
	}
	label := m.ruleLabel(k.rule)
	if k.result == "" {
		c = m.nearLimit.WithLabelValues(k.alg.String(), label)
	} else {
		c = m.decisions.WithLabelValues(k.result, k.alg.String(), label)
	}
	if label == k.rule {
		m.mu.Lock()
		m.dec[k] = c
		m.mu.Unlock()
	}
	return c
}

// ruleLabel returns name, or "_other" once too many distinct names were seen.
func (m *metrics) ruleLabel(name string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.rules[name]; ok {
		return name
	}
	if len(m.rules) >= maxRuleLabels {
		return "_other"
	}
	m.rules[name] = struct{}{}
	return name
}
