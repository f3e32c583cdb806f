package ociimage_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/ociimage"
)

// istioModule reads the module out of img the way Istio's image fetcher
// does for an OCI manifest that is not the tar+gzip "compat" form
// (istio pkg/wasm/imagefetcher.go, extractOCIArtifactImage): exactly two
// layers, the module in the one of the content media type, read as is.
func istioModule(t *testing.T, img v1.Image) []byte {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType == types.DockerManifestSchema2 {
		t.Fatalf("manifest %s: Istio would read it as a Docker image", m.MediaType)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers: Istio takes exactly 2", len(layers))
	}
	for _, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			t.Fatal(err)
		}
		if mt != ociimage.ContentMediaType {
			continue
		}
		r, err := l.Compressed()
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
	t.Fatalf("no layer of type %s", ociimage.ContentMediaType)
	return nil
}

// Pushed to a registry and pulled back as Istio pulls it, by tag and by
// digest, the image yields the module byte for byte.
func TestPlugin_PushPullAsIstio(t *testing.T) {
	wasm := e2etest.Plugin(t)
	img, err := ociimage.Plugin(wasm)
	if err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/sluice/plugin:v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []name.Reference{ref, ref.Context().Digest(digest.String())} {
		desc, err := remote.Get(r)
		if err != nil {
			t.Fatal(err)
		}
		// Istio compares a WasmPlugin's sha256 with this digest.
		if desc.Digest != digest {
			t.Errorf("%s: registry digest %s, built %s", r, desc.Digest, digest)
		}
		pulled, err := desc.Image()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(istioModule(t, pulled), wasm) {
			t.Errorf("%s: the module pulled differs from the one pushed", r)
		}
	}
}

// The same module gives the same image, so a digest pins a build.
func TestPlugin_Reproducible(t *testing.T) {
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	var digests []v1.Hash
	for range 2 {
		img, err := ociimage.Plugin(bytes.Clone(wasm))
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Errorf("digests differ: %v", digests)
	}
	sum := sha256.Sum256(wasm)
	img, _ := ociimage.Plugin(wasm)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Layers[1].Digest.Hex; got != hex.EncodeToString(sum[:]) {
		t.Errorf("content layer digest %s, want the module's sha256", got)
	}
}

func TestPlugin_RefusesNonWasm(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("not wasm at all"), []byte("\x00asm")} {
		if _, err := ociimage.Plugin(b); err == nil || !strings.Contains(err.Error(), "WebAssembly") {
			t.Errorf("%q: err %v", b, err)
		}
	}
}

// Only a statically linked Linux executable makes a bridge or gateway
// image: the image has no dynamic loader or C library; and only a module
// makes the gateway's plugin.
func TestBridge_Refuses(t *testing.T) {
	dynamic, err := os.ReadFile("/bin/true") // Debian's is dynamically linked
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"dynamic", dynamic, "CGO_ENABLED=0"},
		{"wasm", []byte("\x00asm\x01\x00\x00\x00"), "not a Linux executable"},
	} {
		if _, err := ociimage.Bridge(tc.b); err == nil || !strings.Contains(err.Error(), "the bridge") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
		if _, err := ociimage.Gateway(tc.b, []byte("\x00asm\x01\x00\x00\x00")); err == nil || !strings.Contains(err.Error(), "the gateway") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("gateway, %s: err %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := ociimage.Gateway(dynamic, []byte("not wasm")); err == nil || !strings.Contains(err.Error(), "the plugin is not a WebAssembly module") {
		t.Errorf("a gateway image with a plugin that is not wasm: %v", err)
	}
}
