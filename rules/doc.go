// Package rules is Sluice's policy model, shared by the proxy-wasm plugin and
// the bridge: the configuration schema and its validation, request matching,
// client identity, counter keys, response headers, and the wire format that
// carries the limits of one HTTP request from the plugin to the bridge.
//
// It depends only on the standard library and gjson, and builds for
// wasip1, because it runs inside the proxy on every request.
// Configuration is parsed and validated once (ParseConfig); per-request
// work (Policy.Evaluate) reuses caller-owned buffers so that it does not
// allocate in steady state, and a PlanCache spares a proxy evaluating the
// same refused request again and again.
package rules
