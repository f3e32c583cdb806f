package redisbridge

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	reg         *prometheus.Registry
	checks      *prometheus.CounterVec   // by result
	decisions   *prometheus.CounterVec   // by result, algorithm, rule
	checkDur    prometheus.Histogram     // whole check, as the HTTP handler sees it
	storeDur    *prometheus.HistogramVec // by op
	storeErrors *prometheus.CounterVec   // by op
	adminOps    *prometheus.CounterVec   // by action, result

	mu    sync.Mutex
	rules map[string]struct{} // rule label values seen, bounded
}

// maxRuleLabels bounds the rule label: rule names come from callers.
const maxRuleLabels = 500

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), rules: map[string]struct{}{}}
	m.checks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_checks_total", Help: "Check requests by result (allowed, denied, error, invalid).",
	}, []string{"result"})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_bridge_decisions_total", Help: "Limit decisions by result, algorithm and rule.",
	}, []string{"result", "algorithm", "rule"})
	m.checkDur = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_bridge_check_duration_seconds", Help: "Time to answer a check request.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
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
	m.reg.MustRegister(m.checks, m.decisions, m.checkDur, m.storeDur, m.storeErrors, m.adminOps,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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
