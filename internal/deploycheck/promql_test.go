package deploycheck

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// promql parses as a stock Prometheus does: no experimental functions or
// syntax, so what passes here runs on any current Prometheus.
var promql = parser.NewParser(parser.Options{})

// checkQuery parses expr and reports every metric, label and label value it
// names that the catalog does not have, one problem per line.
func checkQuery(c *catalog, expr string) []string {
	root, err := promql.ParseExpr(expr)
	if err != nil {
		return []string{"does not parse: " + err.Error()}
	}
	var problems []string
	add := func(format string, args ...any) {
		if p := fmt.Sprintf(format, args...); !slices.Contains(problems, p) {
			problems = append(problems, p)
		}
	}
	parser.Inspect(root, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			name := selectorName(n)
			if name == "" {
				add("a selector without a metric name: %s", n)
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != labels.MetricName {
					checkLabel(c, name, m, add)
				}
			}
			if !c.known(name) {
				add("metric %s is neither served by the bridge's /metrics nor defined by the plugin (as Envoy and Istio export it); renamed?", name)
			}
		case *parser.AggregateExpr:
			if n.Without {
				return nil
			}
			for _, vs := range selectorsUnder(n.Expr) {
				for _, l := range n.Grouping {
					checkLabel(c, selectorName(vs), &labels.Matcher{Type: labels.MatchRegexp, Name: l}, add)
				}
			}
		}
		return nil
	})
	return problems
}

func (c *catalog) known(name string) bool {
	_, plugin := c.plugin[name]
	_, bridge := c.bridge[name]
	return plugin || bridge || prometheusSynthetic[name]
}

// checkLabel reports a label that the series name does not carry, and for an
// equality matcher, a value the bridge never produced.
func checkLabel(c *catalog, name string, m *labels.Matcher, add func(string, ...any)) {
	if targetLabels[m.Name] || !c.known(name) || m.Name == "le" && c.pluginBuckets[name] {
		return
	}
	ls, bridge := c.bridge[name]
	if !bridge {
		add("label %s: %s carries no labels of its own (only %v from the scrape)", m.Name, name, sortedKeys(targetLabels))
		return
	}
	values, ok := ls[m.Name]
	if !ok {
		add("label %s: %s has labels %v; renamed?", m.Name, name, sortedKeys(ls))
		return
	}
	if m.Type == labels.MatchEqual && !values[m.Value] {
		add("label value %s=%q: %s has %s values %v; renamed?", m.Name, m.Value, name, m.Name, sortedKeys(values))
	}
}

func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

func selectorsUnder(n parser.Node) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// grafanaVars are the values the test gives Grafana's variables: its
// built-in intervals and the dashboard's own variables.
var grafanaVars = map[string]string{
	"__rate_interval": "1m", "__interval": "1m", "__range": "1h",
	"job": "sluice-bridge",
}

var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// expandGrafana substitutes the variables Grafana substitutes before it
// sends a query, so that what reaches the parser is what Prometheus gets.
func expandGrafana(expr string) (string, error) {
	var unknown []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVar.FindStringSubmatch(v)
		name := m[1] + m[2] + m[3]
		val, ok := grafanaVars[name]
		if !ok {
			unknown = append(unknown, name)
		}
		return val
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown Grafana variable(s) %v", unknown)
	}
	return out, nil
}

// A renamed metric, label or label value, a typo and a variable the
// dashboard does not define are each reported, naming what is wrong.
func TestCheckQuery(t *testing.T) {
	c := metricCatalog(t)
	for _, tc := range []struct {
		expr string
		want string // substring of the problem; "" for none
	}{
		{`sum by (result, algorithm, rule) (rate(sluice_bridge_decisions_total{job="b", result="denied"}[5m]))`, ""},
		{`histogram_quantile(0.99, sum by (le, op) (rate(sluice_bridge_store_duration_seconds_bucket[5m])))`, ""},
		{`sum by (instance) (rate(sluice_fail_open_total[5m])) / sum(rate(sluice_requests_total[5m]))`, ""},
		{`up{job="sluice-bridge"} == 0`, ""},
		{`rate(sluice_bridge_decision_total[5m])`, "metric sluice_bridge_decision_total is neither served"},
		{`rate(wasmcustom_sluice_requests_total[5m])`, "metric wasmcustom_sluice_requests_total is neither served"},
		{`sum by (strategy) (rate(sluice_bridge_decisions_total[5m]))`, "label strategy: sluice_bridge_decisions_total has labels [algorithm result rule]"},
		{`rate(sluice_bridge_decisions_total{result="shadow"}[5m])`, `label value result="shadow"`},
		{`sum by (result) (rate(sluice_denied_total[5m]))`, "label result: sluice_denied_total carries no labels"},
		{`rate(sluice_bridge_checks_total[5m]`, "does not parse"},
		{`{job="x"}`, "without a metric name"},
	} {
		problems := checkQuery(c, tc.expr)
		switch {
		case tc.want == "" && len(problems) > 0:
			t.Errorf("%s: unexpected %v", tc.expr, problems)
		case tc.want != "" && !strings.Contains(strings.Join(problems, "\n"), tc.want):
			t.Errorf("%s: got %v, want a problem containing %q", tc.expr, problems, tc.want)
		}
	}
	if _, err := expandGrafana(`rate(x{pod=~"$pod"}[$__rate_interval])`); err == nil || !strings.Contains(err.Error(), "pod") {
		t.Errorf("unknown variable $pod: err %v", err)
	}
	if got, err := expandGrafana(`rate(x{job=~"${job}"}[$__rate_interval]) [[job]]`); err != nil || got != `rate(x{job=~"sluice-bridge"}[1m]) sluice-bridge` {
		t.Errorf("expandGrafana = %q, %v", got, err)
	}
}
