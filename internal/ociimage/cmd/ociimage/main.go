// Command ociimage writes Sluice's OCI images as OCI image layouts
// (`make oci`):
//
//	ociimage -wasm build/plugin.wasm -bridge build/redisbridge-static -gateway build/gateway-static -out build/oci -tag v0.1.0
//
// writes build/oci/plugin, build/oci/redisbridge and build/oci/gateway
// and prints each image's digest, which a WasmPlugin or a Deployment pins.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sluicehq/sluice/internal/ociimage"
)

func main() {
	wasmPath := flag.String("wasm", "build/plugin.wasm", "the plugin module")
	bridgePath := flag.String("bridge", "", "a statically linked redisbridge binary (none: no bridge image)")
	gatewayPath := flag.String("gateway", "", "a statically linked gateway binary, for an image with it and -wasm (none: no gateway image)")
	out := flag.String("out", "build/oci", "directory for the layouts plugin/, redisbridge/ and gateway/ (each replaced)")
	tag := flag.String("tag", "latest", "tag of the images inside their layouts")
	flag.Parse()
	if err := run(*wasmPath, *bridgePath, *gatewayPath, *out, *tag); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(wasmPath, bridgePath, gatewayPath, out, tag string) error {
	gateway := func(binary []byte) (v1.Image, error) {
		wasm, err := os.ReadFile(wasmPath)
		if err != nil {
			return nil, err
		}
		return ociimage.Gateway(binary, wasm)
	}
	images := []struct {
		path, dir string
		build     func([]byte) (v1.Image, error)
	}{{wasmPath, "plugin", ociimage.Plugin}, {bridgePath, "redisbridge", ociimage.Bridge}, {gatewayPath, "gateway", gateway}}
	for _, im := range images {
		if im.path == "" {
			continue
		}
		b, err := os.ReadFile(im.path)
		if err != nil {
			return err
		}
		img, err := im.build(b)
		if err != nil {
			return fmt.Errorf("%s: %w", im.path, err)
		}
		dir := filepath.Join(out, im.dir)
		digest, err := ociimage.WriteLayout(dir, img, tag)
		if err != nil {
			return err
		}
		fmt.Printf("%s: OCI image layout, tag %s, digest %s\n", dir, tag, digest)
	}
	return nil
}
