// Package wasmhost is a proxy-wasm (ABI v0.2.1) host on wazero that runs a
// plugin the way Envoy does: one compiled module, several single-threaded
// worker VMs, a root context per VM, HTTP stream contexts with their full
// lifecycle, pausing and resuming, local responses, HTTP call-outs to named
// clusters, shared data with CAS, metrics, timers and logs.
//
// Where Envoy and a general-purpose runtime differ, the host is Envoy: it
// follows Envoy's host library, proxy-wasm-cpp-host, as Envoy 1.33–1.38
// pin it, and Envoy's own source/extensions/common/wasm, citing them where
// it does. In particular:
//
//   - WASI is cpp-host's: eighteen functions with its answers (no files,
//     no sleeping, stdout and stderr as log entries), and a module that
//     imports anything else is refused at load, as Envoy refuses it.
//   - While the guest starts and while it allocates memory for the host,
//     only the host calls cpp-host allows work; any other traps.
//   - A local response is sent once the plugin's callback returns, and
//     passes through the plugin's own response callback.
//   - Call-out failures reach the plugin as Envoy reports them: 503 and
//     504 answers from Envoy's router, or no response with the status
//     "reset".
//   - A VM that traps stays failed; its requests get Options.FailurePolicy
//     (Envoy's failure_policy).
//   - The plugin reads each part of a response body in its body callback,
//     the last part with the end of the stream, as Envoy's data frames
//     come; it may read a body, not hold or change it. Request bodies are
//     not passed to it.
//
// There is no mode with a fuller WASI: the plugin must run in Envoy, so a
// gateway embedding it gains nothing from functions Envoy lacks, and a
// test on them would pass for a module Envoy refuses.
//
// Gateways and tests embed it with New, run requests with NewStream or
// Middleware, and read what the plugin did with Metric and Logs. A service
// the gateway embeds as well (cmd/gateway's bridge) can answer the
// plugin's call-outs in process (Options.Handlers), with the same outcomes
// as over a connection. When the gateway's own upstream fails,
// UpstreamFailure and WriteLocalResponse answer its client as Envoy's
// router would. The plugin
// is a c-shared wasip1 module (`make wasm`).
package wasmhost
