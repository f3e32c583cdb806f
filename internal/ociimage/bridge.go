package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BridgePath is where the bridge binary sits in its image, the entrypoint.
const BridgePath = "/redisbridge"

// BridgeUser runs the bridge: not root, matching the runAsUser of
// deploy/kubernetes (65532 is "nonroot" in distroless images).
const BridgeUser = "65532:65532"

// BridgePort is the port the bridge listens on by default (--listen :8081).
const BridgePort = "8081/tcp"

// elfArch maps an executable's machine to the image's architecture.
var elfArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// Bridge returns the bridge binary as a one-layer image on an empty base,
// for the architecture the binary is built for:
// the binary alone, so it must be statically linked (CGO_ENABLED=0). There
// are no system CA certificates in it: Redis over TLS takes its CA from
// --redis-tls-ca.
func Bridge(binary []byte) (v1.Image, error) {
	f, err := elf.NewFile(bytes.NewReader(binary))
	if err != nil {
		return nil, fmt.Errorf("ociimage: the bridge is not a Linux executable: %w", err)
	}
	goarch, ok := elfArch[f.Machine]
	if !ok {
		return nil, fmt.Errorf("ociimage: the bridge is built for %v, not amd64 or arm64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, errors.New("ociimage: the bridge is dynamically linked; build it with CGO_ENABLED=0")
		}
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	// A fixed modification time keeps the layer, and so the digest, the same
	// for the same binary.
	hdr := &tar.Header{Name: BridgePath[1:], Mode: 0o555, Size: int64(len(binary)),
		Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tb.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", goarch
	cfg.Config.Entrypoint = []string{BridgePath}
	cfg.Config.User = BridgeUser
	cfg.Config.ExposedPorts = map[string]struct{}{BridgePort: {}}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}
