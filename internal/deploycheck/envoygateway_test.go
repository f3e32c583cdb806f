package deploycheck

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/redisbridge"
)

const envoyGatewayConfig = "../../deploy/envoy-gateway/envoy-gateway-config.yaml"

// envoyGateway holds the fields of Envoy Gateway's EnvoyGateway
// configuration the example sets, named as in envoyproxy/gateway's
// api/v1alpha1 (envoygateway_types.go); decoding refuses any other, so a
// misspelt field fails here rather than being ignored by Envoy Gateway.
type envoyGateway struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Gateway    struct {
		ControllerName string `json:"controllerName"`
	} `json:"gateway"`
	Provider struct {
		Type       string `json:"type"`
		Kubernetes struct {
			RateLimitDeployment struct {
				Replicas  *int `json:"replicas"`
				Container struct {
					Image string          `json:"image"`
					Env   []corev1.EnvVar `json:"env"`
				} `json:"container"`
			} `json:"rateLimitDeployment"`
		} `json:"kubernetes"`
	} `json:"provider"`
	RateLimit struct {
		Backend struct {
			Type  string `json:"type"`
			Redis struct {
				URL string `json:"url"`
			} `json:"redis"`
		} `json:"backend"`
	} `json:"rateLimit"`
}

// The example that makes Envoy Gateway deploy the bridge as its rate
// limit service: its ConfigMap holds an EnvoyGateway configuration with
// the bridge's image (the one deploy/kubernetes runs), a Redis backend,
// and only bridge settings added; and the variables Envoy Gateway makes
// of it, read as the bridge reads them there (--envoy-ratelimit-env),
// give a bridge on that Redis with those settings.
func TestEnvoyGateway_Config(t *testing.T) {
	m, err := decodeManifests(envoyGatewayConfig)
	if err != nil {
		t.Fatal(err)
	}
	cm, ok := m.configMaps["envoy-gateway-system/envoy-gateway-config"]
	if !ok {
		t.Fatalf("no ConfigMap envoy-gateway-system/envoy-gateway-config in %s", envoyGatewayConfig)
	}
	js, err := yaml.YAMLToJSON([]byte(cm.Data["envoy-gateway.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	var eg envoyGateway
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eg); err != nil {
		t.Fatalf("envoy-gateway.yaml: %v", err)
	}
	if eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" || eg.Kind != "EnvoyGateway" || eg.Provider.Type != "Kubernetes" ||
		eg.Gateway.ControllerName != "gateway.envoyproxy.io/gatewayclass-controller" {
		t.Errorf("envoy-gateway.yaml: %s %s, provider %q, controller %q", eg.APIVersion, eg.Kind, eg.Provider.Type, eg.Gateway.ControllerName)
	}
	_, bridge, _ := theContainer(t, kubernetesManifests(t))
	c := eg.Provider.Kubernetes.RateLimitDeployment.Container
	if c.Image != bridge.Image {
		t.Errorf("rate limit image %q, want the bridge's, %q", c.Image, bridge.Image)
	}
	// What Envoy Gateway sets of the Redis backend (its ratelimit
	// resource.go), then the container's own variables.
	redisURL := eg.RateLimit.Backend.Redis.URL
	if eg.RateLimit.Backend.Type != "Redis" || redisURL == "" || strings.Contains(redisURL, "://") {
		t.Fatalf("rateLimit.backend: %q, url %q; want Redis at host:port, as Envoy Gateway passes it on", eg.RateLimit.Backend.Type, redisURL)
	}
	env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisURL, "CONFIG_TYPE": "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit"}
	known := bridgeEnv(t)
	for _, e := range c.Env {
		if !known[e.Name] || e.ValueFrom != nil {
			t.Errorf("container env %s: want a value of one of the bridge's own variables", e.Name)
		}
		env[e.Name] = e.Value
	}
	set, err := redisbridge.ParseSettings([]string{"--envoy-ratelimit-env"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if set.Store != "redis" || set.RedisURL != "redis://"+redisURL || set.RLSXDS != "http://envoy-gateway:18001" || set.RLSOverLimitCache != 100000 {
		t.Errorf("settings: store %s at %s, xDS %s, over-limit cache %d", set.Store, set.RedisURL, set.RLSXDS, set.RLSOverLimitCache)
	}
}
