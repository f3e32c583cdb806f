package main

import (
	"fmt"
	"log/slog"

	"github.com/sluicehq/sluice/redisbridge"
)

// notEmbedded are the bridge's settings about its own listener and
// process (--validate is the gateway's), and its rate limit service for
// Envoy, which Envoy reaches on the listener over HTTP/2: an
// embedded bridge has none (the plugin's call-outs reach it in process,
// its API is on --admin-listen), so they are refused rather than ignored.
var notEmbedded = []string{"SLUICE_LISTEN", "SLUICE_LISTEN_MODE", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY", "SLUICE_SHUTDOWN_GRACE", "SLUICE_MAX_CONNECTION_AGE", "SLUICE_DEBUG_LISTEN", "SLUICE_RLS_CONFIG", "SLUICE_RLS_SHADOW_MODE", "SLUICE_RLS_QUOTA_MODE", "SLUICE_RLS_RESPONSE_HEADERS", "SLUICE_RLS_RESPONSE_HEADER_NAMES", "SLUICE_RLS_RESPONSE_METADATA", "SLUICE_RLS_OVER_LIMIT_CACHE", "SLUICE_VALIDATE"}

// embeddedBridge is the check service for --embed-bridge, in the
// gateway's process, with the settings the bridge's SLUICE_* variables
// give it (docs/bridge.md; getenv is os.Getenv outside tests).
func embeddedBridge(getenv func(string) string, logger *slog.Logger) (*redisbridge.Server, error) {
	for _, name := range notEmbedded {
		if getenv(name) != "" {
			return nil, fmt.Errorf("--embed-bridge: %s does not apply to an embedded bridge: it has no listener of its own (its API is on --admin-listen; Envoy's rate limit service needs a bridge process)", name)
		}
	}
	set, err := redisbridge.ParseSettings(nil, getenv)
	if err != nil {
		// The bridge names its settings by flag; here they are variables.
		return nil, fmt.Errorf("--embed-bridge: %w (the embedded bridge's setting --x-y is the variable SLUICE_X_Y)", err)
	}
	set.Logger = logger.With("component", "bridge")
	br, err := redisbridge.New(set)
	if err != nil {
		return nil, fmt.Errorf("--embed-bridge: %w", err)
	}
	return br, nil
}
