package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/sluicehq/sluice/redisbridge"
)

// notEmbedded tells whether the bridge's setting of the variable name is
// about its own listener and process (--validate is the gateway's): an
// embedded bridge has none (the plugin's call-outs reach it in process,
// its API is on --admin-listen), so they are refused rather than
// ignored; so are all of its TLS settings (SLUICE_TLS_*) and its rate
// limit service's (SLUICE_RLS_*), which Envoy reaches on the listener
// over HTTP/2. By prefix, so a setting added to either is refused too.
func notEmbedded(name string) bool {
	switch name {
	case "SLUICE_LISTEN", "SLUICE_LISTEN_MODE", "SLUICE_SHUTDOWN_GRACE", "SLUICE_MAX_CONNECTION_AGE", "SLUICE_DEBUG_LISTEN", "SLUICE_HEALTH_LISTEN", "SLUICE_VALIDATE",
		"SLUICE_ENVOY_RATELIMIT_ENV":
		return true
	}
	return strings.HasPrefix(name, "SLUICE_TLS_") || strings.HasPrefix(name, "SLUICE_RLS_")
}

// embeddedBridge is the check service for --embed-bridge, in the
// gateway's process, with the settings the bridge's SLUICE_* variables
// give it (docs/bridge.md; getenv is os.Getenv outside tests).
func embeddedBridge(getenv func(string) string, logger *slog.Logger) (*redisbridge.Server, error) {
	refused := func(name string) error {
		return fmt.Errorf("--embed-bridge: %s does not apply to an embedded bridge: it has no listener of its own (its API is on --admin-listen; Envoy's rate limit service needs a bridge process)", name)
	}
	// Every setting the bridge has is looked up here, whatever it is.
	refuse := ""
	set, err := redisbridge.ParseSettings(nil, func(name string) string {
		v := getenv(name)
		if v != "" && refuse == "" && notEmbedded(name) {
			refuse = name
		}
		return v
	})
	if refuse != "" {
		return nil, refused(refuse)
	}
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
