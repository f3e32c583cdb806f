package deploycheck

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/rules"
)

const (
	prometheusDir = "../../deploy/prometheus"
	alertsPath    = prometheusDir + "/alerts.yaml"
	alertTestPath = prometheusDir + "/alerts_test.yaml"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert  string `json:"alert"`
			Record string `json:"record"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

type ruleTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			AlertName string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// readYAML reads the fields these tests use; promtool checks the rest.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// promtool is Prometheus's own checker: `make deps` installs it (Debian's
// prometheus package).
func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: `make deps` installs it (Debian package prometheus)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = prometheusDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %v: %v\n%s", args, err, out)
	}
}

func TestAlerts_Promtool(t *testing.T) {
	promtool(t, "check", "rules", "alerts.yaml")
	promtool(t, "test", "rules", "alerts_test.yaml")
}

// promtool passes a test file that leaves an alert out; this does not.
func TestAlerts_EachFiresAndStaysQuiet(t *testing.T) {
	var rf ruleFile
	readYAML(t, alertsPath, &rf)
	var rt ruleTests
	readYAML(t, alertTestPath, &rt)
	fired, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fired[a.AlertName] = true
			} else {
				quiet[a.AlertName] = true
			}
		}
	}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fired[r.Alert] {
				t.Errorf("%s: no test in %s fires it", r.Alert, alertTestPath)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no test in %s shows it quiet on healthy series", r.Alert, alertTestPath)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts")
	}
}

func TestAlerts_Queries(t *testing.T) {
	c := metricCatalog(t)
	var rf ruleFile
	readYAML(t, alertsPath, &rf)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			for _, p := range checkQuery(c, r.Expr) {
				t.Errorf("%s group %s rule %s: %s\n  expr: %s", alertsPath, g.Name, r.Alert+r.Record, p, r.Expr)
			}
		}
	}
}

// The latency alert compares the p99 with the plugin's default
// bridge.timeout, and that value is a bucket bound of the histogram, so
// the comparison is not an interpolation.
func TestAlerts_LatencyThresholdIsPluginTimeout(t *testing.T) {
	c := metricCatalog(t)
	cfg, err := rules.ParseConfig([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	timeout := float64(cfg.Bridge.TimeoutMS) / 1000
	var rf ruleFile
	readYAML(t, alertsPath, &rf)
	found := false
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "SluiceCheckLatencyHigh" {
				continue
			}
			found = true
			e, err := promql.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			b, ok := e.(*parser.BinaryExpr)
			if !ok || b.Op != parser.GTR {
				t.Fatalf("%s: want <p99> > <seconds>", r.Expr)
			}
			n, ok := b.RHS.(*parser.NumberLiteral)
			if !ok {
				t.Fatalf("%s: want <p99> > <seconds>", r.Expr)
			}
			if n.Val != timeout {
				t.Errorf("threshold %gs, want the plugin's default bridge.timeout %gs", n.Val, timeout)
			}
		}
	}
	if !found {
		t.Fatal("no SluiceCheckLatencyHigh alert")
	}
	les := c.bridge["sluice_bridge_check_duration_seconds_bucket"]["le"]
	if !les[fmt.Sprint(timeout)] {
		t.Errorf("%gs is not a bucket bound of sluice_bridge_check_duration_seconds (%v)", timeout, sortedKeys(les))
	}
}
