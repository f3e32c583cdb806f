package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/sluicehq/sluice/redisbridge"
)

// notEmbedded are the bridge's settings about its own listener and
// process (--validate is the gateway's): an embedded bridge has none (the
// plugin's call-outs reach it in process, its API is on --admin-listen),
// so they are refused rather than ignored; so are all of its rate limit
// service's (SLUICE_RLS_*), which Envoy reaches on the listener over
// HTTP/2.
var notEmbedded = []string{"SLUICE_LISTEN", "SLUICE_LISTEN_MODE", "SLUICE_TLS_CERT", "SLUICE_TLS_KEY", "SLUICE_SHUTDOWN_GRACE", "SLUICE_MAX_CONNECTION_AGE", "SLUICE_DEBUG_LISTEN", "SLUICE_VALIDATE"}

// embeddedBridge is the check service for --embed-bridge, in the
// gateway's process, with the settings the bridge's SLUICE_* variables
// give it (docs/bridge.md; getenv is os.Getenv outside tests).
func embeddedBridge(getenv func(string) string, logger *slog.Logger) (*redisbridge.Server, error) {
	refused := func(name string) error {
		return fmt.Errorf("--embed-bridge: %s does not apply to an embedded bridge: it has no listener of its own (its API is on --admin-listen; Envoy's rate limit service needs a bridge process)", name)
	}
	for _, name := range notEmbedded {
		if getenv(name) != "" {
			return nil, refused(name)
		}
	}
	// The rate limit service's variables are the bridge's own, whatever
	// they are: it looks each of its settings up.
	rls := ""
	set, err := redisbridge.ParseSettings(nil, func(name string) string {
		v := getenv(name)
		if v != "" && rls == "" && strings.HasPrefix(name, "SLUICE_RLS_") {
			rls = name
		}
		return v
	})
	if rls != "" {
		return nil, refused(rls)
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
