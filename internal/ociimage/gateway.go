package ociimage

import (
	"errors"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The gateway's image: its binary, the entrypoint, and the plugin it runs.
const (
	GatewayPath       = "/gateway"
	GatewayPluginPath = "/plugin.wasm"
	GatewayPort       = "8080/tcp" // --listen :8080, the default
	GatewayAdminPort  = "9901/tcp" // --admin-listen, as Envoy's admin port
)

// Gateway returns the gateway binary (statically linked) and the plugin
// module as a one-layer image on an empty base, like the bridge's, with
// SLUICE_GATEWAY_PLUGIN naming the module. There are no system CA
// certificates in it: https upstreams take theirs from --upstream-tls-ca.
func Gateway(binary, wasm []byte) (v1.Image, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("ociimage: the plugin is not a WebAssembly module (no \\0asm header)")
	}
	return staticImage("the gateway", []file{{path: GatewayPath, mode: 0o555, data: binary}, {path: GatewayPluginPath, mode: 0o444, data: wasm}},
		[]string{"SLUICE_GATEWAY_PLUGIN=" + GatewayPluginPath}, GatewayPort, GatewayAdminPort)
}
