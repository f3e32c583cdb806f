// Package wasmhost is a proxy-wasm (ABI v0.2.1) host on wazero that runs a
// plugin the way Envoy does: one compiled module, several single-threaded
// worker VMs, a root context per VM, HTTP stream contexts with their full
// lifecycle, pausing and resuming, local responses, HTTP call-outs to named
// clusters, shared data with CAS, metrics, timers, logs, and replacement of
// a VM that traps.
//
// Gateways and tests embed it with New, run requests with NewStream or
// Middleware, and read what the plugin did with Metric and Logs. The plugin
// is a c-shared wasip1 module (`make wasm`).
package wasmhost
