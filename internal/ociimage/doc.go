// Package ociimage builds Sluice's OCI images, reproducibly (the same
// input gives the same digest, so a digest pins a build), and writes each
// into an OCI image layout directory that `crane push` and
// `oras cp --from-oci-layout` push to a registry (`make oci`):
//
//   - Plugin: the proxy-wasm module, as Istio's WasmPlugin pulls it with an
//     oci:// URL;
//   - Bridge: the redisbridge binary on an empty base, as
//     deploy/kubernetes runs it;
//   - Gateway: the gateway binary and the plugin on an empty base, as
//     deploy/kubernetes/gateway runs it.
package ociimage
