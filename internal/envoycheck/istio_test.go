package envoycheck

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
	files, err := filepath.Glob("../../deploy/istio/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/istio: %v", err)
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
	host := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Metadata.Name, svc.Metadata.Namespace)
	if want := fmt.Sprintf("outbound|%d||%s", port.Port, host); cfg.Bridge.Cluster != want {
		t.Errorf("bridge.cluster %q: Istio names the bridge Service's cluster %q", cfg.Bridge.Cluster, want)
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
