package ociimage

import (
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RefNameAnnotation tags an image inside an OCI layout's index, for
// `oras cp --from-oci-layout DIR:TAG`.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout replaces dir with an OCI image layout holding img alone,
// tagged tag, and returns the image's manifest digest: the digest to pin.
func WriteLayout(dir string, img v1.Image, tag string) (v1.Hash, error) {
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %s: %w", dir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag})); err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %s: %w", dir, err)
	}
	return img.Digest()
}

// configured is img with its configuration changed by set, as an OCI
// manifest with an OCI image configuration: what Istio's own tests push,
// and what every registry stores. Every image of the package ends here.
func configured(img v1.Image, set func(*v1.ConfigFile)) (v1.Image, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	cfg = cfg.DeepCopy()
	set(cfg)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}
