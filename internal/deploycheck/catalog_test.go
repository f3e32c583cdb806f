package deploycheck

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/redisbridge/pgtest"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

// catalog is every series name a Prometheus scraping Sluice can see:
// what a running bridge serves on /metrics, with the labels and label
// values seen there, and what the built plugin defines, under the name a
// proxy exports it with.
type catalog struct {
	bridge map[string]map[string]map[string]bool // series name → label → values
	// plugin maps the series a proxy exports to the name the plugin
	// defined: one series for a counter or gauge; _bucket (with le), _sum
	// and _count for a histogram, whose buckets are in pluginBuckets.
	plugin        map[string]string
	pluginBuckets map[string]bool
}

// targetLabels are attached by Prometheus (job, instance) or by the
// Kubernetes scrape relabelling docs/deploy.md shows (namespace, pod), not
// by the bridge or the proxy.
var targetLabels = map[string]bool{"job": true, "instance": true, "namespace": true, "pod": true}

// prometheusSynthetic are series Prometheus writes itself for each target.
var prometheusSynthetic = map[string]bool{"up": true}

// scratch is a directory for the whole test process (the catalog outlives
// any one test).
var scratch string

func TestMain(m *testing.M) {
	var err error
	if scratch, err = os.MkdirTemp("", "sluice-deploycheck-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(scratch)
	pgtest.RemoveShared()
	os.Exit(code)
}

var (
	catalogOnce sync.Once
	catalogVal  *catalog
	catalogErr  error
)

// metricCatalog builds the catalog once per test process: a bridge and the
// plugin in the wasmhost host, with traffic that makes each labelled
// series appear.
func metricCatalog(t *testing.T) *catalog {
	t.Helper()
	catalogOnce.Do(func() { catalogVal, catalogErr = buildCatalog(pgtest.Shared(t).NewDatabase(t)) })
	if catalogErr != nil {
		t.Fatal(catalogErr)
	}
	return catalogVal
}

// pluginConfig limits /deny to one request and /shadow to one, log_only,
// so the plugin both denies and shadow-denies.
const pluginConfig = `{
  "failure_mode": "fail_open",
  "bridge": {"cluster": "sluice_bridge", "timeout": "2s"},
  "identity": {"client_ip": {"trusted_proxy_depth": 1}, "anonymous": "ip"},
  "rules": [
    {"name": "deny-after-one", "match": {"paths": ["/deny"]}, "limit": 1, "window": "1m"},
    {"name": "shadow", "match": {"paths": ["/shadow"]}, "limit": 1, "window": "1m", "action": "log_only"}
  ]
}`

const adminKey = "deploycheck-admin-key"

// buildCatalog runs the bridge with a policy store at policyURL, so its
// metrics are served too.
func buildCatalog(policyURL string) (*catalog, error) {
	if _, err := rules.ParseConfig([]byte(pluginConfig)); err != nil {
		return nil, fmt.Errorf("test plugin configuration: %w", err)
	}
	set := redisbridge.DefaultSettings()
	set.AdminKey = adminKey
	set.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	set.AuditLog = filepath.Join(scratch, "audit.log")
	set.PolicyStore = policyURL
	br, err := redisbridge.New(set)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	served := make(chan error, 1)
	go func() { served <- br.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		br.Shutdown(ctx)
		<-served
		br.Close()
	}()
	bridgeURL := "http://" + ln.Addr().String()

	wasm, err := e2etest.BuildPlugin()
	if err != nil {
		return nil, err
	}
	cache, err := e2etest.OpenCompilationCache()
	if err != nil {
		return nil, err
	}
	host, err := wasmhost.New(context.Background(), wasm, wasmhost.Options{
		Workers: 1, PluginConfig: []byte(pluginConfig), RootID: "sluice", CompilationCache: cache,
		Clusters: map[string]string{"sluice_bridge": bridgeURL},
	})
	if err != nil {
		return nil, err
	}
	defer host.Close()
	gw := httptest.NewServer(host.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer gw.Close()

	// Through the plugin: allowed, denied by the bridge, then from the
	// local cache; allowed and shadow-denied.
	for _, path := range []string{"/deny", "/deny", "/deny", "/shadow", "/shadow"} {
		if _, err := send(http.MethodGet, gw.URL+path, "", nil); err != nil {
			return nil, err
		}
	}
	// A configuration the plugin refuses.
	if err := host.Configure(context.Background(), []byte(`{"rules": [{"name": "x", "limit": -1}]}`)); err == nil {
		return nil, fmt.Errorf("the plugin accepted a negative limit")
	}
	// At the bridge: an invalid check, an override written with and
	// without the admin key, a batch replayed for its idempotency key.
	admin := map[string]string{"Authorization": "Bearer " + adminKey}
	calls := []struct {
		method, path, body string
		hdr                map[string]string
		want               int
	}{
		{http.MethodPost, "/v1/rate-limit/check", `{"limits": 1}`, nil, 400},
		{http.MethodPut, "/v1/rate-limit/config", `{"user_id": "u1", "endpoint": "*", "limit": 5, "window_seconds": 60, "algorithm": "token_bucket"}`, admin, 200},
		{http.MethodPut, "/v1/rate-limit/config", `{"user_id": "u1", "endpoint": "*", "limit": 5, "window_seconds": 60, "algorithm": "token_bucket"}`, nil, 401},
		{http.MethodPost, "/v1/rate-limit/batch-check", `{"idempotency_key": "k1", "checks": [{"user_id": "u2", "endpoint": "/x"}]}`, nil, 200},
		{http.MethodPost, "/v1/rate-limit/batch-check", `{"idempotency_key": "k1", "checks": [{"user_id": "u2", "endpoint": "/x"}]}`, nil, 200},
	}
	for _, c := range calls {
		res, err := send(c.method, bridgeURL+c.path, c.body, c.hdr)
		if err != nil {
			return nil, err
		}
		if res.StatusCode != c.want {
			return nil, fmt.Errorf("%s %s: status %d, want %d", c.method, c.path, res.StatusCode, c.want)
		}
	}

	res, err := http.Get(bridgeURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, fmt.Errorf("bridge /metrics: %w", err)
	}
	c := &catalog{bridge: map[string]map[string]map[string]bool{}, plugin: map[string]string{}, pluginBuckets: map[string]bool{}}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			for _, s := range seriesOf(name, fam.GetType(), m) {
				ls := c.bridge[s.name]
				if ls == nil {
					ls = map[string]map[string]bool{}
					c.bridge[s.name] = ls
				}
				for k, v := range s.labels {
					if ls[k] == nil {
						ls[k] = map[string]bool{}
					}
					ls[k][v] = true
				}
			}
		}
	}
	for _, name := range host.MetricNames() {
		exported, ok := wasmhost.PrometheusName(name)
		if !ok {
			return nil, fmt.Errorf("plugin metric %q: Envoy leaves it out of /stats/prometheus", name)
		}
		// Envoy exports a histogram as Prometheus does (prometheus_stats.cc,
		// outputHistogram): _bucket with le, _sum and _count.
		if typ, _ := host.MetricType(name); typ == wasmhost.MetricHistogram {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				c.plugin[exported+suffix] = name
			}
			c.pluginBuckets[exported+"_bucket"] = true
			continue
		}
		c.plugin[exported] = name
	}
	return c, nil
}

type sample struct {
	name   string
	labels map[string]string
}

// seriesOf is the series a metric family's member is scraped as: one for a
// counter or gauge; _bucket (with le), _sum and _count for a histogram.
func seriesOf(name string, typ dto.MetricType, m *dto.Metric) []sample {
	base := map[string]string{}
	for _, lp := range m.GetLabel() {
		base[lp.GetName()] = lp.GetValue()
	}
	with := func(k, v string) map[string]string {
		out := map[string]string{k: v}
		for a, b := range base {
			out[a] = b
		}
		return out
	}
	switch typ {
	case dto.MetricType_HISTOGRAM:
		out := []sample{{name + "_sum", base}, {name + "_count", base}}
		for _, b := range m.GetHistogram().GetBucket() {
			out = append(out, sample{name + "_bucket", with("le", fmt.Sprint(b.GetUpperBound()))})
		}
		return append(out, sample{name + "_bucket", with("le", "+Inf")})
	case dto.MetricType_SUMMARY:
		out := []sample{{name + "_sum", base}, {name + "_count", base}}
		for _, q := range m.GetSummary().GetQuantile() {
			out = append(out, sample{name, with("quantile", fmt.Sprint(q.GetQuantile()))})
		}
		return out
	}
	return []sample{{name, base}}
}

// The catalog holds what the dashboard and alerts rely on; if the plugin or
// the bridge stopped producing one of these, the checks below would pass
// for the wrong reason.
func TestCatalog_Complete(t *testing.T) {
	c := metricCatalog(t)
	for _, name := range []string{"sluice_requests_total", "sluice_denied_total", "sluice_config_refused_total", "sluice_fail_open_total"} {
		if _, ok := c.plugin[name]; !ok {
			t.Errorf("plugin metric %s missing; plugin defines %v", name, sortedKeys(c.plugin))
		}
	}
	for name, labels := range map[string]map[string]string{
		"sluice_bridge_decisions_total":               {"result": "denied"},
		"sluice_bridge_checks_total":                  {"result": "invalid"},
		"sluice_bridge_admin_requests_total":          {"action": "config.put", "result": "unauthorized"},
		"sluice_bridge_store_errors_total":            {"op": "check"},
		"sluice_bridge_check_duration_seconds_bucket": {"le": "0.2"},
		"sluice_bridge_idempotent_replays_total":      {},
	} {
		ls, ok := c.bridge[name]
		if !ok {
			t.Errorf("bridge series %s missing", name)
			continue
		}
		for k, v := range labels {
			if !ls[k][v] {
				t.Errorf("bridge series %s{%s=%q} missing; %s has %v", name, k, v, k, sortedKeys(ls[k]))
			}
		}
	}
}

func send(method, url, body string, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
