package envoycheck

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// envoyDoc is envoy.yaml as generic JSON values, for tests to break.
func envoyDoc(t testing.TB) map[string]any {
	t.Helper()
	return yamlDoc(t, "../../envoy.yaml")
}

// yamlDoc is the YAML file at path as generic JSON values.
func yamlDoc(t testing.TB, path string) map[string]any {
	t.Helper()
	js, err := yaml.YAMLToJSON(readFile(t, path))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// at walks doc by map keys and list indexes.
func at(t testing.TB, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not an object", p)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: not a list with that index", p)
			}
			v = l[k]
		}
	}
	return v
}

func obj(t testing.TB, v any, path ...any) map[string]any {
	t.Helper()
	m, ok := at(t, v, path...).(map[string]any)
	if !ok {
		t.Fatalf("at %v: not an object", path)
	}
	return m
}

func hcm(t testing.TB, doc map[string]any) map[string]any {
	return obj(t, doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
}

func pluginConfigHolder(t testing.TB, doc map[string]any) map[string]any {
	return obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "configuration")
}

func cluster(t testing.TB, doc map[string]any, name string) map[string]any {
	for _, c := range at(t, doc, "static_resources", "clusters").([]any) {
		if m := c.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("no cluster %q", name)
	return nil
}

func TestCheck_EnvoyYAML(t *testing.T) {
	if err := Check(readFile(t, "../../envoy.yaml")); err != nil {
		t.Fatalf("envoy.yaml refused:\n%v", err)
	}
}

// The plugin configuration in envoy.yaml is the documented example; the
// two must not drift apart.
func TestEnvoyYAML_PluginConfigIsExample(t *testing.T) {
	var inYAML, example any
	if err := json.Unmarshal([]byte(pluginConfigHolder(t, envoyDoc(t))["value"].(string)), &inYAML); err != nil {
		t.Fatalf("envoy.yaml plugin configuration: %v", err)
	}
	if err := json.Unmarshal(readFile(t, "../../examples/config.json"), &example); err != nil {
		t.Fatalf("examples/config.json: %v", err)
	}
	if !reflect.DeepEqual(inYAML, example) {
		t.Fatal("the plugin configuration in envoy.yaml differs from examples/config.json")
	}
}

func TestCheck_Refuses(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, doc map[string]any)
		want   []string // each must appear in the error
	}{
		{
			name: "router not last",
			break_: func(t *testing.T, doc map[string]any) {
				h := hcm(t, doc)
				f := h["http_filters"].([]any)
				f[1], f[2] = f[2], f[1]
			},
			want: []string{"http_filters[1](envoy.filters.http.router): the router must be the last HTTP filter; envoy.filters.http.wasm comes after it",
				"http_filters[2](envoy.filters.http.wasm): the wasm filter must come before the router"},
		},
		{
			name: "no router",
			break_: func(t *testing.T, doc map[string]any) {
				h := hcm(t, doc)
				h["http_filters"] = h["http_filters"].([]any)[:2]
			},
			want: []string{"no router filter"},
		},
		{
			name: "unknown cluster in the plugin config",
			break_: func(t *testing.T, doc map[string]any) {
				p := pluginConfigHolder(t, doc)
				p["value"] = strings.Replace(p["value"].(string), `"cluster": "sluice_bridge"`, `"cluster": "sluice-bridge"`, 1)
			},
			want: []string{`configuration.bridge.cluster: cluster "sluice-bridge" is not in static_resources.clusters (known: sluice_bridge, upstream)`},
		},
		{
			name: "invalid plugin JSON",
			break_: func(t *testing.T, doc map[string]any) {
				p := pluginConfigHolder(t, doc)
				p["value"] = strings.TrimSuffix(strings.TrimSpace(p["value"].(string)), "}")
			},
			want: []string{"configuration: plugin configuration refused: configuration is not valid JSON"},
		},
		{
			name: "plugin config field the plugin does not know",
			break_: func(t *testing.T, doc map[string]any) {
				p := pluginConfigHolder(t, doc)
				p["value"] = strings.Replace(p["value"].(string), `"failure_mode"`, `"failure_mod"`, 1)
			},
			want: []string{"plugin configuration refused: failure_mod: unknown field"},
		},
		{
			name: "plugin config not a StringValue",
			break_: func(t *testing.T, doc map[string]any) {
				p := pluginConfigHolder(t, doc)
				p["@type"] = "type.googleapis.com/google.protobuf.UInt32Value"
				p["value"] = 7
			},
			want: []string{`configuration: must be a google.protobuf.StringValue holding the plugin's JSON configuration, got "type.googleapis.com/google.protobuf.UInt32Value"`},
		},
		{
			name: "negative timeout",
			break_: func(t *testing.T, doc map[string]any) {
				cluster(t, doc, "sluice_bridge")["connect_timeout"] = "-1s"
			},
			want: []string{"static_resources.clusters[0].connect_timeout: value must be greater than 0s"},
		},
		{
			name: "typo in a field name",
			break_: func(t *testing.T, doc map[string]any) {
				c := cluster(t, doc, "upstream")
				c["conect_timeout"] = c["connect_timeout"]
				delete(c, "connect_timeout")
			},
			want: []string{`unknown field "conect_timeout"`},
		},
		{
			name: "typo in a field name inside an Any",
			break_: func(t *testing.T, doc map[string]any) {
				hcm(t, doc)["merge_slashs"] = true
			},
			want: []string{`unknown field "merge_slashs"`},
		},
		{
			name: "invalid value inside the connection manager Any",
			break_: func(t *testing.T, doc map[string]any) {
				hcm(t, doc)["stat_prefix"] = ""
			},
			want: []string{"filters[0](envoy.filters.network.http_connection_manager).typed_config.stat_prefix: value length must be at least 1 runes"},
		},
		{
			name: "invalid value inside the cluster protocol options Any",
			break_: func(t *testing.T, doc map[string]any) {
				o := obj(t, cluster(t, doc, "sluice_bridge"), "typed_extension_protocol_options",
					"envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "explicit_http_config", "http2_protocol_options")
				o["initial_stream_window_size"] = 1
			},
			want: []string{"http2_protocol_options.initial_stream_window_size: value must be inside range [65535, 2147483647]"},
		},
		{
			name: "invalid value inside the wasm filter Any",
			break_: func(t *testing.T, doc map[string]any) {
				obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "vm_config", "code", "local")["filename"] = ""
			},
			want: []string{"vm_config.code.local.filename: value length must be at least 1 runes"},
		},
		{
			name: "unregistered typed config",
			break_: func(t *testing.T, doc map[string]any) {
				obj(t, hcm(t, doc), "http_filters", 0, "typed_config")["@type"] = "type.googleapis.com/envoy.extensions.filters.http.nope.v3.Nope"
			},
			want: []string{"envoy.extensions.filters.http.nope.v3.Nope"},
		},
		{
			name: "bridge cluster without HTTP/2",
			break_: func(t *testing.T, doc map[string]any) {
				delete(cluster(t, doc, "sluice_bridge"), "typed_extension_protocol_options")
			},
			want: []string{"static_resources.clusters[0](sluice_bridge): the bridge cluster must speak HTTP/2"},
		},
		{
			name: "route to an unknown cluster",
			break_: func(t *testing.T, doc map[string]any) {
				obj(t, hcm(t, doc), "route_config", "virtual_hosts", 0, "routes", 0, "route")["cluster"] = "app"
			},
			want: []string{`route_config.virtual_hosts[0](app).routes[0].route.cluster: cluster "app" is not in static_resources.clusters`},
		},
		{
			name: "duplicate cluster",
			break_: func(t *testing.T, doc map[string]any) {
				cluster(t, doc, "upstream")["name"] = "sluice_bridge"
			},
			want: []string{`clusters[1](sluice_bridge).name: "sluice_bridge" is already the name of static_resources.clusters[0](sluice_bridge)`},
		},
		{
			name: "plugin loaded from elsewhere",
			break_: func(t *testing.T, doc map[string]any) {
				obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "vm_config", "code", "local")["filename"] = "plugin.wasm"
			},
			want: []string{`vm_config.code.local.filename: must load the plugin from the local file "build/plugin.wasm", got "plugin.wasm"`},
		},
		{
			name: "null runtime",
			break_: func(t *testing.T, doc map[string]any) {
				obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "vm_config")["runtime"] = "envoy.wasm.runtime.null"
			},
			want: []string{`vm_config.runtime: "envoy.wasm.runtime.null" cannot run a Go wasip1 module`},
		},
		{
			name: "no plugin at all",
			break_: func(t *testing.T, doc map[string]any) {
				h := hcm(t, doc)
				f := h["http_filters"].([]any)
				h["http_filters"] = []any{f[0], f[2]}
			},
			want: []string{"no Sluice filter"},
		},
		{
			name: "trusted hops out of step with the plugin",
			break_: func(t *testing.T, doc map[string]any) {
				hcm(t, doc)["xff_num_trusted_hops"] = 1
			},
			want: []string{"typed_config.xff_num_trusted_hops: is 1 but the plugin's identity.client_ip.trusted_proxy_depth is 1"},
		},
		{
			name: "no remote address",
			break_: func(t *testing.T, doc map[string]any) {
				hcm(t, doc)["use_remote_address"] = false
			},
			want: []string{"typed_config.use_remote_address: must be true"},
		},
		{
			name: "no path normalization",
			break_: func(t *testing.T, doc map[string]any) {
				h := hcm(t, doc)
				delete(h, "normalize_path")
				h["merge_slashes"] = false
				h["path_with_escaped_slashes_action"] = "KEEP_UNCHANGED"
			},
			want: []string{"typed_config.normalize_path: must be true", "typed_config.merge_slashes: must be true",
				"typed_config.path_with_escaped_slashes_action: must be REJECT_REQUEST or UNESCAPE_AND_REDIRECT, got KEEP_UNCHANGED"},
		},
		{
			name: "trusted identity headers left to the client",
			break_: func(t *testing.T, doc map[string]any) {
				h := hcm(t, doc)
				h["http_filters"] = h["http_filters"].([]any)[1:]
			},
			want: []string{`configuration.identity.sources[1].header: "x-user-id" is trusted as the user id, but clients can send it`,
				`configuration.tiers.header: "x-tier" is trusted as the client's tier, but clients can send it`},
		},
		{
			name: "environment variable given twice",
			break_: func(t *testing.T, doc map[string]any) {
				env := obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "vm_config", "environment_variables")
				env["key_values"] = map[string]any{"RATE_LIMIT_CHAT_WINDOW": "60"}
			},
			want: []string{`vm_config.environment_variables.host_env_keys[1]: "RATE_LIMIT_CHAT_WINDOW" is given twice`},
		},
		{
			name: "bad environment variable",
			break_: func(t *testing.T, doc map[string]any) {
				vm := obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config", "vm_config")
				vm["environment_variables"] = map[string]any{"key_values": map[string]any{"RATE_LIMIT_AUTH_REQUESTS": "five"}}
			},
			want: []string{`configuration: plugin configuration refused: RATE_LIMIT_AUTH_REQUESTS: must be a whole number`},
		},
		{
			name:   "not YAML",
			break_: nil,
			want:   []string{"not valid YAML"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []byte
			if tt.break_ == nil {
				in = []byte("static_resources: [\n")
			} else {
				doc := envoyDoc(t)
				tt.break_(t, doc)
				var err error
				if in, err = json.Marshal(doc); err != nil {
					t.Fatal(err)
				}
			}
			err := Check(in)
			if err == nil {
				t.Fatal("Check accepted the broken file")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// Each problem is its own error, so callers can list them.
func TestCheck_ReportsEveryProblem(t *testing.T) {
	doc := envoyDoc(t)
	h := hcm(t, doc)
	h["merge_slashes"] = false
	cluster(t, doc, "sluice_bridge")["connect_timeout"] = "0s"
	in, _ := json.Marshal(doc)
	err := Check(in)
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("want joined problems, got %v", err)
	}
	var problems []*Problem
	for _, e := range joined.Unwrap() {
		var p *Problem
		if !errors.As(e, &p) {
			t.Fatalf("problem %v is not a *Problem", e)
		}
		problems = append(problems, p)
	}
	if len(problems) != 2 {
		t.Fatalf("want 2 problems, got %d:\n%v", len(problems), err)
	}
	if !strings.HasSuffix(problems[0].Where, "connect_timeout") || !strings.HasSuffix(problems[1].Where, "merge_slashes") {
		t.Errorf("problems at %q and %q", problems[0].Where, problems[1].Where)
	}
}

func TestCheck_DecodeErrorNamesYAMLLine(t *testing.T) {
	src := strings.Replace(string(readFile(t, "../../envoy.yaml")), "codec_type: AUTO", "codec_type: AUTOMATIC", 1)
	err := Check([]byte(src))
	if err == nil || !strings.Contains(err.Error(), "codec_type at line ") {
		t.Fatalf("want the YAML line of codec_type, got %v", err)
	}
}

func TestSnakePath(t *testing.T) {
	for in, want := range map[string]string{
		"ConnectTimeout":                         "connect_timeout",
		"Clusters[0]":                            "clusters[0]",
		"Http2ProtocolOptions":                   "http2_protocol_options",
		"XffNumTrustedHops":                      "xff_num_trusted_hops",
		"TypedExtensionProtocolOptions[envoy.X]": "typed_extension_protocol_options[envoy.X]",
		"codecType":                              "codec_type",
	} {
		if got := snakePath(in); got != want {
			t.Errorf("snakePath(%q) = %q, want %q", in, got, want)
		}
	}
}

// Check reads operator files, but it must never panic on any input, and
// its report must not depend on map iteration order.
func FuzzCheck(f *testing.F) {
	f.Add(readFile(f, "../../envoy.yaml"))
	f.Add([]byte("static_resources: {clusters: [{name: a, connect_timeout: -1s}]}"))
	f.Add([]byte(`{"static_resources":{"listeners":[{"filter_chains":[{"filters":[{"name":"h","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager","http_filters":[{"name":"w","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm","config":{"configuration":{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"{}"}}}}]}}]}]}]}}`))
	f.Add([]byte("- [\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		e1, e2 := Check(in), Check(in)
		if (e1 == nil) != (e2 == nil) || (e1 != nil && e1.Error() != e2.Error()) {
			t.Fatalf("two checks of the same input differ:\n%v\n---\n%v", e1, e2)
		}
	})
}

// Not a hot path; measured so a slow check shows up before CI does.
func BenchmarkCheck(b *testing.B) {
	in := readFile(b, "../../envoy.yaml")
	b.ReportAllocs()
	for b.Loop() {
		if err := Check(in); err != nil {
			b.Fatal(err)
		}
	}
}

// The vm_config example of docs/deploy.md, put in place of envoy.yaml's,
// is a configuration Envoy and the plugin accept.
func TestCheck_DeployDocVMConfig(t *testing.T) {
	var example string
	for _, block := range strings.Split(string(readFile(t, "../../docs/deploy.md")), "```yaml\n")[1:] {
		if body, _, _ := strings.Cut(block, "```"); strings.HasPrefix(body, "vm_config:") {
			example = body
		}
	}
	if example == "" {
		t.Fatal("docs/deploy.md has no ```yaml block starting with vm_config:")
	}
	js, err := yaml.YAMLToJSON([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	var vm map[string]any
	if err := json.Unmarshal(js, &vm); err != nil {
		t.Fatal(err)
	}
	if _, ok := at(t, vm, "vm_config", "environment_variables", "key_values").(map[string]any); !ok {
		t.Fatal("the example sets no key_values, so nothing of it reaches the plugin's parser")
	}
	doc := envoyDoc(t)
	obj(t, hcm(t, doc), "http_filters", 1, "typed_config", "config")["vm_config"] = vm["vm_config"]
	in, _ := json.Marshal(doc)
	if err := Check(in); err != nil {
		t.Errorf("docs/deploy.md's vm_config: %v", err)
	}
}

// The bridge cluster's examples of docs/deploy.md, each put in
// envoy.yaml's cluster sluice_bridge in place of what it sets there, are a
// cluster Envoy accepts: the Unix socket address, and TLS with a client
// certificate (mutual TLS).
func TestCheck_DeployDocBridgeCluster(t *testing.T) {
	for _, tt := range []struct{ name, start, has string }{
		{"a pipe address", "load_assignment:", "pipe:"},
		{"mutual TLS", "transport_socket:", "tls_certificates:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var example string
			for _, block := range strings.Split(string(readFile(t, "../../docs/deploy.md")), "```yaml\n")[1:] {
				if body, _, _ := strings.Cut(block, "```"); strings.HasPrefix(body, tt.start) && strings.Contains(body, tt.has) {
					example = body
				}
			}
			if example == "" {
				t.Fatalf("docs/deploy.md has no ```yaml block starting with %s with %s", tt.start, tt.has)
			}
			js, err := yaml.YAMLToJSON([]byte(example))
			if err != nil {
				t.Fatal(err)
			}
			var fields map[string]any
			if err := json.Unmarshal(js, &fields); err != nil {
				t.Fatal(err)
			}
			doc := envoyDoc(t)
			maps.Copy(cluster(t, doc, "sluice_bridge"), fields)
			in, _ := json.Marshal(doc)
			if err := Check(in); err != nil {
				t.Errorf("docs/deploy.md's %s: %v", tt.name, err)
			}
		})
	}
}

// examples/rls/envoy.yaml, Envoy's own rate limit filter calling the
// bridge as its rate limit service, passes; each of its parts the filter
// needs to reach the bridge, removed or broken, is named.
func TestCheck_RateLimitExample(t *testing.T) {
	const file = "../../examples/rls/envoy.yaml"
	if err := Check(readFile(t, file)); err != nil {
		t.Fatalf("%s refused:\n%v", file, err)
	}
	for _, tt := range []struct {
		name   string
		break_ func(t *testing.T, doc map[string]any)
		want   string
	}{
		{"the bridge over HTTP/1.1", func(t *testing.T, doc map[string]any) {
			delete(cluster(t, doc, "sluice_bridge"), "typed_extension_protocol_options")
		}, "static_resources.clusters[0](sluice_bridge): the rate limit service speaks gRPC: the cluster needs HTTP/2"},
		{"an unknown cluster", func(t *testing.T, doc map[string]any) {
			obj(t, hcm(t, doc), "http_filters", 0, "typed_config", "rate_limit_service", "grpc_service", "envoy_grpc")["cluster_name"] = "nope"
		}, `rate_limit_service.grpc_service.envoy_grpc.cluster_name: cluster "nope" is not in static_resources.clusters`},
		{"no descriptors", func(t *testing.T, doc map[string]any) {
			vh := obj(t, hcm(t, doc), "route_config", "virtual_hosts", 0)
			delete(vh, "rate_limits")
			for _, r := range vh["routes"].([]any) {
				delete(r.(map[string]any)["route"].(map[string]any), "rate_limits")
			}
		}, "http_filters[0](envoy.filters.http.ratelimit).typed_config: no virtual host or route has rate_limits of stage 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := yamlDoc(t, file)
			tt.break_(t, doc)
			in, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			if err := Check(in); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}
