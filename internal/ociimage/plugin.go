package ociimage

import (
	"errors"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Media types of the Wasm image specification's artifact layout, as
// Istio's image fetcher matches them.
const (
	ConfigMediaType  types.MediaType = "application/vnd.module.wasm.config.v1+json"
	ContentMediaType types.MediaType = "application/vnd.module.wasm.content.layer.v1+wasm"
)

// runtimeConfig is the configuration layer: the runtime and ABI the module
// is built for. Proxies do not read it; registries and tools show it.
const runtimeConfig = `{"type":"envoy_proxy","abiVersions":["v0.2.1"]}`

// titleAnnotation names a layer's file, as the specification's example
// and oras do.
const titleAnnotation = "org.opencontainers.image.title"

// Plugin returns wasm as an image in the Wasm artifact layout Istio pulls.
//
// That is the Wasm artifact layout of the Wasm image
// specification (its "oci" variant): an OCI image manifest with two layers,
// the runtime configuration (application/vnd.module.wasm.config.v1+json) and
// the module itself, byte for byte
// (application/vnd.module.wasm.content.layer.v1+wasm). Istio's image fetcher
// (pkg/wasm/imagefetcher.go, extractOCIArtifactImage) takes an OCI manifest
// with exactly two layers and reads the module from the layer of the content
// media type, uncompressed. A single-layer push of the module alone
// (`oras push ref plugin.wasm:...`) is refused there.
func Plugin(wasm []byte) (v1.Image, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("ociimage: not a WebAssembly module (no \\0asm header)")
	}
	img, err := mutate.Append(empty.Image,
		mutate.Addendum{Layer: static.NewLayer([]byte(runtimeConfig), ConfigMediaType),
			Annotations: map[string]string{titleAnnotation: "runtime-config.json"}},
		mutate.Addendum{Layer: static.NewLayer(wasm, ContentMediaType),
			Annotations: map[string]string{titleAnnotation: "plugin.wasm"}},
	)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	return configured(img, func(cfg *v1.ConfigFile) {
		cfg.OS, cfg.Architecture = "wasip1", "wasm" // GOOS and GOARCH of the build
	})
}
