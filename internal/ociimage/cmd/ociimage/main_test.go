package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/ociimage"
)

// What `make oci` writes, read back from disk: one image, tagged, whose
// module layer is byte for byte the plugin.wasm it was made from, with the
// manifest and layer media types Istio's WasmPlugin pulls.
func TestRun_LayoutReadBack(t *testing.T) {
	dir := t.TempDir()
	wasmPath := filepath.Join(dir, "plugin.wasm")
	if err := os.WriteFile(wasmPath, e2etest.Plugin(t), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "oci", "plugin")
	for range 2 { // a second run replaces the first
		if err := run(wasmPath, "", "", filepath.Dir(out), "v9.9.9"); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(wasmPath)
	if err != nil {
		t.Fatal(err)
	}

	idx, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests in the layout; crane push takes exactly one image", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 || desc.Annotations[ociimage.RefNameAnnotation] != "v9.9.9" {
		t.Errorf("index entry %s %v: want an OCI manifest tagged v9.9.9", desc.MediaType, desc.Annotations)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("manifest %s, config %s: want an OCI image manifest and configuration", m.MediaType, m.Config.MediaType)
	}
	var gotTypes []types.MediaType
	for _, l := range m.Layers {
		gotTypes = append(gotTypes, l.MediaType)
	}
	if len(gotTypes) != 2 || gotTypes[0] != ociimage.ConfigMediaType || gotTypes[1] != ociimage.ContentMediaType {
		t.Fatalf("layers %v: want [%s %s]", gotTypes, ociimage.ConfigMediaType, ociimage.ContentMediaType)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	read := func(i int) []byte {
		r, err := layers[i].Compressed()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := read(1); !bytes.Equal(got, want) {
		t.Errorf("module layer: %d bytes, differs from plugin.wasm (%d bytes)", len(got), len(want))
	}
	var rc struct {
		Type        string   `json:"type"`
		ABIVersions []string `json:"abiVersions"`
	}
	if err := json.Unmarshal(read(0), &rc); err != nil || rc.Type != "envoy_proxy" || len(rc.ABIVersions) != 1 {
		t.Errorf("runtime configuration %+v, %v", rc, err)
	}
	if d, _ := img.Digest(); d != desc.Digest {
		t.Errorf("image digest %s, index says %s", d, desc.Digest)
	}
}

func TestRun_RefusesNonWasm(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "plugin.wasm")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(p, "", "", filepath.Join(dir, "oci"), "x"); err == nil {
		t.Fatal("a shell script became an image")
	}
	if _, err := os.Stat(filepath.Join(dir, "oci", "plugin")); !os.IsNotExist(err) {
		t.Errorf("a refused module left a layout behind: %v", err)
	}
}

// onlyImage is the single image of the layout at dir, with its tag.
func onlyImage(t *testing.T, dir string) (v1.Image, string) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s: %d manifests, want one image", dir, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0].Annotations[ociimage.RefNameAnnotation]
}

// The bridge and gateway images `make oci` writes: the statically linked
// binary, the entrypoint, with the plugin beside the gateway's; a user
// that is not root; their ports; nothing else. `make oci` builds the real
// binaries with CGO_ENABLED=0; here a small static executable stands in.
func TestRun_StaticImages(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "static")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/static")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building a static executable: %v\n%s", err, out)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	wasmPath := filepath.Join(dir, "plugin.wasm")
	if err := os.WriteFile(wasmPath, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(wasmPath, bin, bin, filepath.Join(dir, "oci"), "v9.9.9"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir   string
		files map[string]string // by path in the image: data, "dir", or "-> " and a link's target; the first in the layer is the entrypoint
		entry string
		env   []string
		ports []string
	}{
		// /bin/ratelimit: the bridge where envoyproxy/ratelimit's
		// deployments (Envoy Gateway's) run that service's binary.
		{"redisbridge", map[string]string{ociimage.BridgePath: string(exe), "/bin/": "dir", ociimage.BridgeRatelimitPath: "-> " + ociimage.BridgePath},
			ociimage.BridgePath, nil, []string{ociimage.BridgePort}},
		{"gateway", map[string]string{ociimage.GatewayPath: string(exe), ociimage.GatewayPluginPath: string(wasm)}, ociimage.GatewayPath,
			[]string{"SLUICE_GATEWAY_PLUGIN=" + ociimage.GatewayPluginPath}, []string{ociimage.GatewayPort, ociimage.GatewayAdminPort}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			img, tag := onlyImage(t, filepath.Join(dir, "oci", tc.dir))
			if tag != "v9.9.9" {
				t.Errorf("tag %q", tag)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cfg.Config
			if !slices.Equal(c.Entrypoint, []string{tc.entry}) || c.User != ociimage.BridgeUser || cfg.OS != "linux" || !slices.Equal(c.Env, tc.env) {
				t.Errorf("config %s/%s entrypoint %v user %q env %v", cfg.OS, cfg.Architecture, c.Entrypoint, c.User, c.Env)
			}
			var ports []string
			for p := range c.ExposedPorts {
				ports = append(ports, p)
			}
			slices.Sort(ports)
			if want := slices.Sorted(slices.Values(tc.ports)); !slices.Equal(ports, want) {
				t.Errorf("exposed ports %v, want %v", ports, want)
			}
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers: %d, %v", len(layers), err)
			}
			if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
				t.Errorf("layer media type %s", mt)
			}
			r, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			tr := tar.NewReader(r)
			got := map[string]string{}
			for first := true; ; first = false {
				h, err := tr.Next()
				if err == io.EOF {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				switch h.Typeflag {
				case tar.TypeDir:
					got["/"+h.Name] = "dir"
					continue
				case tar.TypeSymlink:
					got["/"+h.Name] = "-> " + h.Linkname
					continue
				}
				got["/"+h.Name] = string(b)
				if exec := h.Mode&0o111 != 0; exec != first || first && "/"+h.Name != tc.entry {
					t.Errorf("%s mode %o: want the entrypoint first and alone executable", h.Name, h.Mode)
				}
			}
			if !reflect.DeepEqual(got, tc.files) {
				t.Errorf("the layer holds %d files (%v), want %d", len(got), slices.Sorted(maps.Keys(got)), len(tc.files))
			}
		})
	}
}
