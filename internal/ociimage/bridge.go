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

// BridgeRatelimitPath runs the bridge as envoyproxy/ratelimit's binary,
// which reads that service's environment variables
// (--envoy-ratelimit-env): where a deployment such as Envoy Gateway's
// runs /bin/ratelimit in the image it is given. A link to BridgePath.
const BridgeRatelimitPath = "/bin/ratelimit"

// Bridge returns the bridge binary as a one-layer image on an empty base,
// for the architecture the binary is built for:
// the binary alone, so it must be statically linked (CGO_ENABLED=0). There
// are no system CA certificates in it: Redis over TLS takes its CA from
// --redis-tls-ca.
func Bridge(binary []byte) (v1.Image, error) {
	return staticImage("the bridge", []file{{path: BridgePath, mode: 0o555, data: binary},
		{path: "/bin", mode: 0o755, dir: true}, {path: BridgeRatelimitPath, mode: 0o777, link: BridgePath}}, nil, BridgePort)
}
