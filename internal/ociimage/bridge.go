package ociimage

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BridgePath is where the bridge binary sits in its image, the entrypoint.
const BridgePath = "/redisbridge"

// BridgeUser runs the bridge: not root, matching the runAsUser of
// deploy/kubernetes (65532 is "nonroot" in distroless images). The
// gateway's image runs as the same user.
const BridgeUser = "65532:65532"

// BridgePort is the port the bridge listens on by default (--listen :8081).
const BridgePort = "8081/tcp"

// Bridge returns the bridge binary as a one-layer image on an empty base,
// for the architecture the binary is built for:
// the binary alone, so it must be statically linked (CGO_ENABLED=0). There
// are no system CA certificates in it: Redis over TLS takes its CA from
// --redis-tls-ca.
func Bridge(binary []byte) (v1.Image, error) {
	return staticImage("the bridge", []file{{BridgePath, 0o555, binary}}, nil, BridgePort)
}
