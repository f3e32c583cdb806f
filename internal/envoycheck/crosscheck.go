package envoycheck

import (
	"fmt"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/rules"
)

// httpProtocolOptionsKey is the typed_extension_protocol_options key Envoy
// reads a cluster's upstream HTTP settings from.
const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// wasmRuntimes run a module built by upstream Go; the null runtime loads
// only plugins compiled into Envoy.
var wasmRuntimes = []string{"envoy.wasm.runtime.v8", "envoy.wasm.runtime.wamr", "envoy.wasm.runtime.wasmtime"}

type clusterRef struct {
	path    string
	cluster *clusterv3.Cluster
}

// crossCheck runs the checks that span messages. Typed configs that do not
// unpack were already reported by validate and are skipped here.
func (c *checker) crossCheck(b *bootstrapv3.Bootstrap) {
	sr := b.GetStaticResources()
	clusters := map[string]clusterRef{}
	for i, cl := range sr.GetClusters() {
		p := fmt.Sprintf("static_resources.clusters[%d](%s)", i, cl.GetName())
		if prev, dup := clusters[cl.GetName()]; dup {
			c.addf(p+".name", "%q is already the name of %s", cl.GetName(), prev.path)
			continue
		}
		clusters[cl.GetName()] = clusterRef{p, cl}
	}
	plugins := 0
	for li, l := range sr.GetListeners() {
		lp := fmt.Sprintf("static_resources.listeners[%d](%s)", li, l.GetName())
		for fci, fc := range l.GetFilterChains() {
			fcp := fmt.Sprintf("%s.filter_chains[%d]", lp, fci)
			for fi, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if !unpack(f.GetTypedConfig(), hcm) {
					continue
				}
				fp := fmt.Sprintf("%s.filters[%d](%s).typed_config", fcp, fi, f.GetName())
				plugins += c.checkHCM(fp, hcm, clusters)
			}
		}
	}
	if plugins == 0 {
		c.addf("static_resources.listeners", "no Sluice filter: no HTTP connection manager has an envoy.filters.http.wasm filter, or an envoy.filters.http.ratelimit filter calling the bridge")
	}
}

// unpack reports whether a holds a message of m's type and decodes it.
func unpack(a *anypb.Any, m proto.Message) bool {
	return a != nil && a.MessageIs(m) && a.UnmarshalTo(m) == nil
}

// checkHCM checks one HTTP connection manager and returns how many Sluice
// filters it holds.
func (c *checker) checkHCM(path string, hcm *hcmv3.HttpConnectionManager, clusters map[string]clusterRef) int {
	c.checkRoutes(join(path, "route_config"), hcm.GetRouteConfig(), clusters)

	filters := hcm.GetHttpFilters()
	fpath := func(i int) string {
		return fmt.Sprintf("%s.http_filters[%d](%s)", path, i, filters[i].GetName())
	}
	router := -1
	for i, f := range filters {
		if unpack(f.GetTypedConfig(), &routerv3.Router{}) {
			router = i
		}
	}
	switch {
	case router < 0:
		c.addf(join(path, "http_filters"), "no router filter (envoy.extensions.filters.http.router.v3.Router); it must be the last HTTP filter")
	case router != len(filters)-1:
		c.addf(fpath(router), "the router must be the last HTTP filter; %s comes after it and never runs", filters[len(filters)-1].GetName())
	}

	plugins := 0
	for i, f := range filters {
		w := &wasmfilterv3.Wasm{}
		if !unpack(f.GetTypedConfig(), w) {
			continue
		}
		plugins++
		p := fpath(i)
		if router >= 0 && i > router {
			c.addf(p, "the wasm filter must come before the router")
		}
		c.checkPlugin(join(p, "typed_config.config"), w, hcm, path, filters[:i], clusters)
	}
	for i, f := range filters {
		rl := &ratelimitv3.RateLimit{}
		if !unpack(f.GetTypedConfig(), rl) {
			continue
		}
		plugins++
		c.checkRateLimit(join(fpath(i), "typed_config"), rl, hcm, clusters)
	}
	return plugins
}

// checkRateLimit checks Envoy's rate limit filter with the bridge as its
// rate limit service: the service's cluster exists and speaks HTTP/2, as
// gRPC needs, and some route or virtual host makes descriptors for it to
// send (without rate_limits actions the filter never calls).
func (c *checker) checkRateLimit(path string, rl *ratelimitv3.RateLimit, hcm *hcmv3.HttpConnectionManager, clusters map[string]clusterRef) {
	gp := join(path, "rate_limit_service.grpc_service")
	if name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); name != "" {
		if c.clusterExists(join(gp, "envoy_grpc.cluster_name"), name, clusters) && !speaksHTTP2(clusters[name].cluster) {
			c.addf(clusters[name].path, "the rate limit service speaks gRPC: the cluster needs HTTP/2 (explicit_http_config.http2_protocol_options)")
		}
	}
	stage := rl.GetStage()
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRateLimits() {
			if r.GetStage().GetValue() == stage {
				return
			}
		}
		for _, route := range vh.GetRoutes() {
			for _, r := range route.GetRoute().GetRateLimits() {
				if r.GetStage().GetValue() == stage {
					return
				}
			}
		}
	}
	c.addf(path, "no virtual host or route has rate_limits of stage %d: the filter makes no descriptors and never calls the bridge", stage)
}

func (c *checker) checkRoutes(path string, rc *routev3.RouteConfiguration, clusters map[string]clusterRef) {
	for vi, vh := range rc.GetVirtualHosts() {
		vp := fmt.Sprintf("%s.virtual_hosts[%d](%s)", path, vi, vh.GetName())
		for ri, r := range vh.GetRoutes() {
			ra := r.GetRoute()
			if ra == nil {
				continue
			}
			rp := fmt.Sprintf("%s.routes[%d].route", vp, ri)
			if name := ra.GetCluster(); name != "" {
				c.clusterExists(join(rp, "cluster"), name, clusters)
			}
			for wi, wc := range ra.GetWeightedClusters().GetClusters() {
				c.clusterExists(fmt.Sprintf("%s.weighted_clusters.clusters[%d].name", rp, wi), wc.GetName(), clusters)
			}
			for mi, mp := range ra.GetRequestMirrorPolicies() {
				if name := mp.GetCluster(); name != "" {
					c.clusterExists(fmt.Sprintf("%s.request_mirror_policies[%d].cluster", rp, mi), name, clusters)
				}
			}
		}
	}
}

func (c *checker) clusterExists(path, name string, clusters map[string]clusterRef) bool {
	if _, ok := clusters[name]; ok {
		return true
	}
	known := make([]string, 0, len(clusters))
	for n := range clusters {
		known = append(known, n)
	}
	sort.Strings(known)
	c.addf(path, "cluster %q is not in static_resources.clusters (known: %s)", name, strings.Join(known, ", "))
	return false
}

// checkPlugin checks the Sluice filter and the settings around it that the
// plugin relies on.
func (c *checker) checkPlugin(path string, w *wasmfilterv3.Wasm, hcm *hcmv3.HttpConnectionManager, hcmPath string,
	before []*hcmv3.HttpFilter, clusters map[string]clusterRef) {
	pc := w.GetConfig()
	vm := pc.GetVmConfig()
	if vm == nil {
		c.addf(join(path, "vm_config"), "missing: the plugin needs a VM running %s", PluginPath)
	} else {
		if !contains(wasmRuntimes, vm.GetRuntime()) {
			c.addf(join(path, "vm_config.runtime"), "%q cannot run a Go wasip1 module; use one of %s", vm.GetRuntime(), strings.Join(wasmRuntimes, ", "))
		}
		if fn := vm.GetCode().GetLocal().GetFilename(); fn != PluginPath {
			got := "code that is not a local file"
			if fn != "" {
				got = fmt.Sprintf("%q", fn)
			}
			c.addf(join(path, "vm_config.code.local.filename"), "must load the plugin from the local file %q, got %s", PluginPath, got)
		}
	}

	cp := join(path, "configuration")
	raw, ok := pluginJSON(pc.GetConfiguration())
	if !ok {
		c.addf(cp, "must be a google.protobuf.StringValue holding the plugin's JSON configuration, got %q", pc.GetConfiguration().GetTypeUrl())
		return
	}
	cfg, err := rules.ParseConfigEnv(raw, c.vmEnvironment(join(path, "vm_config.environment_variables"), vm))
	if err != nil {
		c.addf(cp, "plugin configuration refused: %v", err)
		return
	}

	bp := join(cp, "bridge.cluster")
	if c.clusterExists(bp, cfg.Bridge.Cluster, clusters) {
		ref := clusters[cfg.Bridge.Cluster]
		if !speaksHTTP2(ref.cluster) {
			c.addf(ref.path, "the bridge cluster must speak HTTP/2: set typed_extension_protocol_options[%s] explicit_http_config.http2_protocol_options", httpProtocolOptionsKey)
		}
	}

	c.checkClientIP(hcmPath, hcm, &cfg.Identity.ClientIP)
	c.checkPaths(hcmPath, hcm)
	c.checkTrustedHeaders(cp, cfg, before)
}

// vmEnvironment checks the VM's environment_variables as Envoy does and
// returns a lookup over what is known offline: key_values. host_env_keys
// take Envoy's own environment at startup, so they count as unset here.
// Envoy refuses a name that is both a key_values key and a host_env_key, or
// a host_env_key listed twice (source/extensions/common/wasm/plugin.cc,
// WasmConfig).
func (c *checker) vmEnvironment(path string, vm *wasmv3.VmConfig) func(string) (string, bool) {
	ev := vm.GetEnvironmentVariables()
	kv := ev.GetKeyValues()
	seen := map[string]bool{}
	for k := range kv {
		seen[k] = true
	}
	for i, k := range ev.GetHostEnvKeys() {
		if seen[k] {
			c.addf(fmt.Sprintf("%s.host_env_keys[%d]", path, i), "%q is given twice (in key_values or host_env_keys); Envoy refuses the configuration", k)
		}
		seen[k] = true
	}
	return func(name string) (string, bool) {
		v, ok := kv[name]
		return v, ok
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// pluginJSON returns the bytes Envoy hands the plugin: StringValue and
// BytesValue lose their wrapper, a Struct is serialized as JSON.
func pluginJSON(a *anypb.Any) ([]byte, bool) {
	if a == nil {
		return nil, false
	}
	sv := &wrapperspb.StringValue{}
	if unpack(a, sv) {
		return []byte(sv.GetValue()), true
	}
	bv := &wrapperspb.BytesValue{}
	if unpack(a, bv) {
		return bv.GetValue(), true
	}
	st := &structpb.Struct{}
	if unpack(a, st) {
		b, err := st.MarshalJSON()
		return b, err == nil
	}
	return nil, false
}

// speaksHTTP2 reports whether Envoy opens HTTP/2 connections to the cluster.
// auto_config negotiates through ALPN, so it yields HTTP/2 only over TLS.
func speaksHTTP2(cl *clusterv3.Cluster) bool {
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if !unpack(cl.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey], opts) {
		return false
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
		return true
	}
	return opts.GetAutoConfig().GetHttp2ProtocolOptions() != nil && cl.GetTransportSocket() != nil
}

// checkClientIP keeps Envoy's X-Forwarded-For handling and the plugin's
// trusted_proxy_depth in step. With use_remote_address Envoy appends the
// peer address before filters run, so the plugin, reading the header after
// that, must trust one entry more than Envoy's xff_num_trusted_hops.
func (c *checker) checkClientIP(path string, hcm *hcmv3.HttpConnectionManager, ip *rules.ClientIPConfig) {
	if len(ip.TrustedProxies) > 0 || ip.TrustedProxyDepth == 0 {
		return // the plugin does not count hops
	}
	if !hcm.GetUseRemoteAddress().GetValue() {
		c.addf(join(path, "use_remote_address"), "must be true: the plugin's identity.client_ip.trusted_proxy_depth (%d) counts the X-Forwarded-For entry Envoy appends, which it appends only with use_remote_address", ip.TrustedProxyDepth)
		return
	}
	if want := ip.TrustedProxyDepth - 1; int(hcm.GetXffNumTrustedHops()) != want {
		c.addf(join(path, "xff_num_trusted_hops"), "is %d but the plugin's identity.client_ip.trusted_proxy_depth is %d; they must differ by one (depth = hops + 1, the entry Envoy appends), or Envoy and the plugin disagree on who the client is", hcm.GetXffNumTrustedHops(), ip.TrustedProxyDepth)
	}
}

// checkPaths requires the path normalization the plugin's path patterns
// assume: the limit must see the same path the upstream will serve.
func (c *checker) checkPaths(path string, hcm *hcmv3.HttpConnectionManager) {
	if !hcm.GetNormalizePath().GetValue() {
		c.addf(join(path, "normalize_path"), "must be true: the plugin matches limits on the path, and /a/./b or /a/../b must not slip past a limit on /b")
	}
	if !hcm.GetMergeSlashes() {
		c.addf(join(path, "merge_slashes"), "must be true: //api/v1/login must meet the limit on /api/v1/login")
	}
	switch hcm.GetPathWithEscapedSlashesAction() {
	case hcmv3.HttpConnectionManager_REJECT_REQUEST, hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT:
	default:
		c.addf(join(path, "path_with_escaped_slashes_action"), "must be REJECT_REQUEST or UNESCAPE_AND_REDIRECT, got %s: an upstream that decodes %%2F would serve /api/v1/files%%2Fx as a path the plugin never limited", hcm.GetPathWithEscapedSlashesAction())
	}
}

// checkTrustedHeaders makes sure headers the plugin takes as verified
// identity cannot come from the client: an earlier filter must remove them
// (header_mutation) or own them (jwt_authn removes its forward_payload_header
// and claim_to_headers from incoming requests before it sets them).
func (c *checker) checkTrustedHeaders(path string, cfg *rules.Config, before []*hcmv3.HttpFilter) {
	owned := map[string]bool{}
	for _, f := range before {
		hm := &headermutationv3.HeaderMutation{}
		if unpack(f.GetTypedConfig(), hm) {
			for _, m := range hm.GetMutations().GetRequestMutations() {
				if r := m.GetRemove(); r != "" {
					owned[strings.ToLower(r)] = true
				}
			}
		}
		ja := &jwtauthnv3.JwtAuthentication{}
		if unpack(f.GetTypedConfig(), ja) {
			for _, p := range ja.GetProviders() {
				if h := p.GetForwardPayloadHeader(); h != "" {
					owned[strings.ToLower(h)] = true
				}
				for _, ch := range p.GetClaimToHeaders() {
					owned[strings.ToLower(ch.GetHeaderName())] = true
				}
			}
		}
	}
	need := func(where, header, what string) {
		if !owned[header] {
			c.addf(where, "%q is trusted as %s, but clients can send it: remove it with an envoy.filters.http.header_mutation filter (or have jwt_authn set it) before the wasm filter", header, what)
		}
	}
	for i, s := range cfg.Identity.Sources {
		where := fmt.Sprintf("%s.identity.sources[%d].header", path, i)
		switch s.Kind {
		case rules.SourceHeader:
			need(where, s.Header, "the user id")
		case rules.SourceJWTPayload:
			need(where, s.Header, "a verified JWT payload")
		}
	}
	if cfg.Tiers.Header != "" {
		need(path+".tiers.header", cfg.Tiers.Header, "the client's tier")
	}
}
