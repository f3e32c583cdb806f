package rules

import (
	"errors"
	"strconv"
	"strings"
)

// Environment variables give the well-known categories (chat, upload,
// auth) their defaults, for deployments that set limits per environment
// rather than per configuration: RATE_LIMIT_<NAME>_REQUESTS is the limit,
// RATE_LIMIT_<NAME>_WINDOW the window, in seconds ("60") or as a duration
// ("1m"). They sit between the built-in defaults and the configuration:
// a field the configuration sets wins over the variable, the variable over
// the built-in default. They only apply to categories the configuration
// declares, since only it can say which paths a category covers.
//
// The proxy decides which variables a plugin VM sees (Envoy:
// vm_config.environment_variables); the plugin never reads the proxy's
// own environment.

// envRequests and envWindow name the variables of a category.
func envRequests(name string) string { return "RATE_LIMIT_" + strings.ToUpper(name) + "_REQUESTS" }
func envWindow(name string) string   { return "RATE_LIMIT_" + strings.ToUpper(name) + "_WINDOW" }

// envDefaults reads the variables of every well-known category, in a fixed
// order, so that a bad value is refused whether or not the configuration
// uses the category. An empty value counts as unset.
func (p *parser) envDefaults() {
	if p.lookupEnv == nil {
		return
	}
	p.envSpecs = map[string]LimitSpec{}
	for _, name := range [...]string{"chat", "upload", "auth"} {
		d := categoryDefaults[name]
		s := LimitSpec{Algorithm: SlidingWindow, Limit: d.limit, WindowMS: d.windowMS, Cost: 1}
		if v, ok := p.lookupEnv(envRequests(name)); ok && v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > MaxLimitValue {
				p.fail(envRequests(name), "must be a whole number of requests from 1 to %d, got %q", int64(MaxLimitValue), v)
				return
			}
			s.Limit = n
		}
		if v, ok := p.lookupEnv(envWindow(name)); ok && v != "" {
			ms, err := envWindowMS(v)
			if err != nil {
				p.fail(envWindow(name), "%v", err)
				return
			}
			s.WindowMS = ms
		}
		s.Burst = s.Limit
		p.envSpecs[name] = s
	}
}

// envWindowMS reads a window given in seconds ("60") or as a duration ("1m").
func envWindowMS(v string) (int64, error) {
	bad := errors.New(`must be a whole number of seconds ("60") or a duration ("1m"), from 1s to a year, got "` + v + `"`)
	ms, err := ParseDurationMS(v)
	if n, nerr := strconv.ParseInt(v, 10, 64); nerr == nil {
		if n < 1 || n > MaxWindowMS/1000 {
			return 0, bad
		}
		ms, err = n*1000, nil
	}
	if err != nil || ms < 1000 || ms > MaxWindowMS {
		return 0, bad
	}
	return ms, nil
}
