package envoycheck

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/rules"
)

// k8sObject is the part of a Kubernetes manifest these tests read.
type k8sObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// istioObjects reads every manifest in deploy/istio, keyed by kind.
func istioObjects(t *testing.T) map[string][]k8sObject {
	t.Helper()
	return manifestsIn(t, "../../deploy/istio")
}

// manifestsIn reads every manifest in dir, keyed by kind.
func manifestsIn(t *testing.T, dir string) map[string][]k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	objs := map[string][]k8sObject{}
	for _, f := range files {
		for i, doc := range docSeparator.Split(string(readFile(t, f)), -1) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if string(js) == "null" {
				continue // comments only
			}
			var o k8sObject
			if err := json.Unmarshal(js, &o); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s document %d: no kind or metadata.name", f, i)
			}
			objs[o.Kind] = append(objs[o.Kind], o)
		}
	}
	return objs
}

func only(t *testing.T, objs map[string][]k8sObject, kind string) k8sObject {
	t.Helper()
	if len(objs[kind]) != 1 {
		t.Fatalf("want one %s in deploy/istio, got %d", kind, len(objs[kind]))
	}
	return objs[kind][0]
}

type wasmPluginSpec struct {
	URL          string          `json:"url"`
	Phase        string          `json:"phase"`
	FailStrategy string          `json:"failStrategy"`
	Type         string          `json:"type"`
	PluginConfig json.RawMessage `json:"pluginConfig"`
	Selector     struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
}

// The pluginConfig reaches the plugin as the JSON of a Struct; the plugin
// must accept it, and its bridge cluster must be the outbound cluster Istio
// builds for the bridge Service.
func TestIstio_WasmPlugin(t *testing.T) {
	objs := istioObjects(t)
	wp := only(t, objs, "WasmPlugin")
	if wp.APIVersion != "extensions.istio.io/v1alpha1" {
		t.Errorf("WasmPlugin apiVersion %q", wp.APIVersion)
	}
	var spec wasmPluginSpec
	if err := json.Unmarshal(wp.Spec, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Phase != "AUTHZ" {
		t.Errorf("phase %q: want AUTHZ, after jwt_authn has verified the payload header", spec.Phase)
	}
	if spec.FailStrategy != "FAIL_CLOSE" && spec.FailStrategy != "FAIL_OPEN" {
		t.Errorf("failStrategy %q: say it explicitly", spec.FailStrategy)
	}
	if !strings.HasPrefix(spec.URL, "oci://") && !strings.HasPrefix(spec.URL, "file://") {
		t.Errorf("url %q: want oci:// or file://", spec.URL)
	}
	if len(spec.Selector.MatchLabels) == 0 {
		t.Error("no selector: the plugin would apply to every proxy in the namespace")
	}

	cfg, err := rules.ParseConfig(spec.PluginConfig)
	if err != nil {
		t.Fatalf("pluginConfig refused by the plugin: %v", err)
	}

	host, cluster := bridgeCluster(t, objs)
	if cfg.Bridge.Cluster != cluster {
		t.Errorf("bridge.cluster %q: Istio names the bridge Service's cluster %q", cfg.Bridge.Cluster, cluster)
	}

	dr := only(t, objs, "DestinationRule")
	var drSpec struct {
		Host          string `json:"host"`
		TrafficPolicy struct {
			ConnectionPool struct {
				HTTP struct {
					H2UpgradePolicy string `json:"h2UpgradePolicy"`
				} `json:"http"`
			} `json:"connectionPool"`
		} `json:"trafficPolicy"`
	}
	if err := json.Unmarshal(dr.Spec, &drSpec); err != nil {
		t.Fatal(err)
	}
	if drSpec.Host != host {
		t.Errorf("DestinationRule host %q, want the bridge Service %q", drSpec.Host, host)
	}
	if drSpec.TrafficPolicy.ConnectionPool.HTTP.H2UpgradePolicy != "UPGRADE" {
		t.Errorf("DestinationRule h2UpgradePolicy %q, want UPGRADE", drSpec.TrafficPolicy.ConnectionPool.HTTP.H2UpgradePolicy)
	}

	// Every payload header the plugin trusts is written, and sanitized, by
	// the gateway's jwt_authn, configured through RequestAuthentication.
	ra := only(t, objs, "RequestAuthentication")
	var raSpec struct {
		JWTRules []struct {
			OutputPayloadToHeader string `json:"outputPayloadToHeader"`
		} `json:"jwtRules"`
	}
	if err := json.Unmarshal(ra.Spec, &raSpec); err != nil {
		t.Fatal(err)
	}
	for i, s := range cfg.Identity.Sources {
		switch s.Kind {
		case rules.SourceJWTPayload:
			found := false
			for _, r := range raSpec.JWTRules {
				found = found || strings.EqualFold(r.OutputPayloadToHeader, s.Header)
			}
			if !found {
				t.Errorf("identity.sources[%d]: header %q is not the outputPayloadToHeader of any jwtRule", i, s.Header)
			}
		case rules.SourceHeader:
			t.Errorf("identity.sources[%d]: a plain header source is client-settable at an Istio gateway", i)
		}
	}
	if cfg.Tiers.Header != "" {
		t.Errorf("tiers.header %q is client-settable at an Istio gateway; use tiers.claim", cfg.Tiers.Header)
	}
}

// bridgeCluster is the host of the bridge Service in objs (deploy/istio),
// and the outbound cluster Istio builds for it, which the plugin calls.
func bridgeCluster(t *testing.T, objs map[string][]k8sObject) (host, cluster string) {
	t.Helper()
	svc := only(t, objs, "Service")
	var svcSpec struct {
		Ports []struct {
			Name        string `json:"name"`
			AppProtocol string `json:"appProtocol"`
			Port        int    `json:"port"`
		} `json:"ports"`
	}
	if err := json.Unmarshal(svc.Spec, &svcSpec); err != nil {
		t.Fatal(err)
	}
	if len(svcSpec.Ports) != 1 {
		t.Fatalf("bridge Service: want one port, got %d", len(svcSpec.Ports))
	}
	port := svcSpec.Ports[0]
	if port.AppProtocol != "http2" && port.AppProtocol != "grpc" {
		t.Errorf("bridge Service port appProtocol %q: want http2 so Istio speaks HTTP/2 to the bridge", port.AppProtocol)
	}
	host = fmt.Sprintf("%s.%s.svc.cluster.local", svc.Metadata.Name, svc.Metadata.Namespace)
	return host, fmt.Sprintf("outbound|%d||%s", port.Port, host)
}

// The mesh example puts the plugin on one workload's sidecars, inbound:
// the plugin accepts its configuration, which calls the bridge Service's
// cluster and identifies each calling service by its certificate first.
func TestIstio_MeshWasmPlugin(t *testing.T) {
	wp := only(t, manifestsIn(t, "../../deploy/istio/mesh"), "WasmPlugin")
	var spec struct {
		wasmPluginSpec
		Match []struct {
			Mode string `json:"mode"`
		} `json:"match"`
	}
	if err := json.Unmarshal(wp.Spec, &spec); err != nil {
		t.Fatal(err)
	}
	if wp.APIVersion != "extensions.istio.io/v1alpha1" || spec.Phase != "AUTHZ" || spec.FailStrategy == "" {
		t.Errorf("WasmPlugin %s, phase %q, failStrategy %q: want extensions.istio.io/v1alpha1, AUTHZ, one said", wp.APIVersion, spec.Phase, spec.FailStrategy)
	}
	if len(spec.Selector.MatchLabels) == 0 {
		t.Error("no selector: the plugin would apply to every proxy in the namespace")
	}
	if len(spec.Match) != 1 || spec.Match[0].Mode != "SERVER" {
		t.Errorf("match %+v: want the inbound side only (mode SERVER)", spec.Match)
	}
	cfg, err := rules.ParseConfig(spec.PluginConfig)
	if err != nil {
		t.Fatalf("pluginConfig refused by the plugin: %v", err)
	}
	if _, cluster := bridgeCluster(t, istioObjects(t)); cfg.Bridge.Cluster != cluster {
		t.Errorf("bridge.cluster %q: Istio names the bridge Service's cluster %q", cfg.Bridge.Cluster, cluster)
	}
	if len(cfg.Identity.Sources) == 0 || cfg.Identity.Sources[0].Kind != rules.SourcePeerCertificate {
		t.Errorf("identity.sources %+v: want the calling workload's certificate first", cfg.Identity.Sources)
	}
	for i, s := range cfg.Identity.Sources {
		if s.Kind == rules.SourceHeader {
			t.Errorf("identity.sources[%d]: a plain header source is the caller's to set", i)
		}
	}
}

// The rate limit filter's EnvoyFilter, each patch decoded as the Envoy
// message Istio makes of it and validated: the filter calls the bridge
// Service's outbound cluster with the check token, for the domain the
// bridge's rate limit ConfigMap configures, and the virtual hosts get
// descriptors to send.
func TestIstio_EnvoyRateLimit(t *testing.T) {
	ef := manifestsIn(t, "../../deploy/istio/envoy-ratelimit")["EnvoyFilter"]
	if len(ef) != 1 || ef[0].APIVersion != "networking.istio.io/v1alpha3" {
		t.Fatalf("want one networking.istio.io/v1alpha3 EnvoyFilter, got %+v", ef)
	}
	var spec struct {
		WorkloadSelector struct {
			Labels map[string]string `json:"labels"`
		} `json:"workloadSelector"`
		ConfigPatches []struct {
			ApplyTo string `json:"applyTo"`
			Match   struct {
				Context  string `json:"context"`
				Listener struct {
					FilterChain struct {
						Filter struct {
							SubFilter struct {
								Name string `json:"name"`
							} `json:"subFilter"`
						} `json:"filter"`
					} `json:"filterChain"`
				} `json:"listener"`
			} `json:"match"`
			Patch struct {
				Operation string          `json:"operation"`
				Value     json.RawMessage `json:"value"`
			} `json:"patch"`
		} `json:"configPatches"`
	}
	if err := json.Unmarshal(ef[0].Spec, &spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.WorkloadSelector.Labels) == 0 {
		t.Error("no workloadSelector: the filter would apply to every proxy in its namespace")
	}
	svc := only(t, istioObjects(t), "Service")
	var svcSpec struct {
		Ports []struct {
			Port int `json:"port"`
		} `json:"ports"`
	}
	if err := json.Unmarshal(svc.Spec, &svcSpec); err != nil || len(svcSpec.Ports) != 1 {
		t.Fatalf("bridge Service ports: %v", err)
	}
	wantCluster := fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", svcSpec.Ports[0].Port, svc.Metadata.Name, svc.Metadata.Namespace)
	var filters, vhosts int
	for i, p := range spec.ConfigPatches {
		at := fmt.Sprintf("configPatches[%d]", i)
		if p.Match.Context != "GATEWAY" {
			t.Errorf("%s: context %q, want GATEWAY", at, p.Match.Context)
		}
		switch p.ApplyTo {
		case "HTTP_FILTER":
			filters++
			if p.Patch.Operation != "INSERT_BEFORE" || p.Match.Listener.FilterChain.Filter.SubFilter.Name != "envoy.filters.http.router" {
				t.Errorf("%s: %s relative to %q, want INSERT_BEFORE the router", at, p.Patch.Operation, p.Match.Listener.FilterChain.Filter.SubFilter.Name)
			}
			var f hcmv3.HttpFilter
			var rl ratelimitv3.RateLimit
			if err := protojson.Unmarshal(p.Patch.Value, &f); err != nil {
				t.Fatalf("%s: not an HttpFilter: %v", at, err)
			}
			if err := f.ValidateAll(); err != nil {
				t.Errorf("%s: %v", at, err)
			}
			if !unpack(f.GetTypedConfig(), &rl) {
				t.Fatalf("%s: typed_config is not a RateLimit", at)
			}
			if err := rl.ValidateAll(); err != nil {
				t.Errorf("%s: %v", at, err)
			}
			gs := rl.GetRateLimitService().GetGrpcService()
			if got := gs.GetEnvoyGrpc().GetClusterName(); got != wantCluster {
				t.Errorf("%s: cluster %q, Istio names the bridge Service's %q", at, got, wantCluster)
			}
			token := false
			for _, md := range gs.GetInitialMetadata() {
				token = token || (md.GetKey() == "authorization" && strings.HasPrefix(md.GetValue(), "Bearer "))
			}
			if !token {
				t.Errorf("%s: no authorization metadata: the bridge in deploy/kubernetes requires its check token", at)
			}
			if d := rl.GetDomain(); d != bridgeRateLimitDomain(t) {
				t.Errorf("%s: domain %q, the bridge's ConfigMap configures %q", at, d, bridgeRateLimitDomain(t))
			}
		case "VIRTUAL_HOST":
			vhosts++
			var vh routev3.VirtualHost
			if err := protojson.Unmarshal(p.Patch.Value, &vh); err != nil {
				t.Fatalf("%s: not a VirtualHost: %v", at, err)
			}
			if len(vh.GetRateLimits()) == 0 {
				t.Errorf("%s: no rate_limits: the filter would send no descriptors", at)
			}
			for j, r := range vh.GetRateLimits() {
				if err := r.ValidateAll(); err != nil {
					t.Errorf("%s.rate_limits[%d]: %v", at, j, err)
				}
			}
		default:
			t.Errorf("%s: applyTo %s", at, p.ApplyTo)
		}
	}
	if filters != 1 || vhosts == 0 {
		t.Errorf("%d HTTP_FILTER and %d VIRTUAL_HOST patches, want one and some", filters, vhosts)
	}
}

// bridgeRateLimitDomain is the domain of the bridge's rate limit
// ConfigMap in deploy/kubernetes.
func bridgeRateLimitDomain(t *testing.T) string {
	t.Helper()
	cms := manifestsIn(t, "../../deploy/kubernetes")["ConfigMap"]
	if len(cms) != 1 {
		t.Fatalf("want the one ConfigMap sluice-ratelimit in deploy/kubernetes, got %d", len(cms))
	}
	js, err := yaml.YAMLToJSON(readFile(t, "../../deploy/kubernetes/15-ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(js, &cm); err != nil {
		t.Fatal(err)
	}
	js, err = yaml.YAMLToJSON([]byte(cm.Data["ratelimit.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Domain string `json:"domain"`
	}
	if err := json.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Domain
}
