package ociimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// elfArch maps an executable's machine to the image's architecture.
var elfArch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}

// file is one file of a static image's layer: data, or with link a
// symbolic link to that path, or with dir a directory.
type file struct {
	path string
	mode int64
	data []byte
	link string
	dir  bool
}

// staticImage returns files as a one-layer image on an empty base, for the
// architecture of files[0], the entrypoint (what names it in errors): a
// Linux executable that must be statically linked, since the image has no
// dynamic loader or C library. It runs as BridgeUser, with env and the
// ports given.
func staticImage(what string, files []file, env []string, ports ...string) (v1.Image, error) {
	f, err := elf.NewFile(bytes.NewReader(files[0].data))
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s is not a Linux executable: %w", what, err)
	}
	goarch, ok := elfArch[f.Machine]
	if !ok {
		return nil, fmt.Errorf("ociimage: %s is built for %v, not amd64 or arm64", what, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("ociimage: %s is dynamically linked; build it with CGO_ENABLED=0", what)
		}
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, fl := range files {
		// A fixed modification time keeps the layer, and so the digest,
		// the same for the same files.
		hdr := &tar.Header{Name: fl.path[1:], Mode: fl.mode, Size: int64(len(fl.data)),
			Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case fl.dir:
			hdr.Name, hdr.Typeflag = hdr.Name+"/", tar.TypeDir
		case fl.link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, fl.link
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
		if _, err := tw.Write(fl.data); err != nil {
			return nil, fmt.Errorf("ociimage: %w", err)
		}
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
	return configured(img, func(cfg *v1.ConfigFile) {
		cfg.OS, cfg.Architecture = "linux", goarch
		cfg.Config.Entrypoint = []string{files[0].path}
		cfg.Config.User = BridgeUser
		cfg.Config.Env = env
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range ports {
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	})
}
