// Package store keeps Sluice's rate limit counters. Two stores implement one
// interface with the same algorithms and rounding: Redis (Lua scripts, one
// EVALSHA per check) and memory (one node, an injected clock).
package store

import (
	"context"
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/rules"
)

// Store decides checks against shared counters.
type Store interface {
	// Check decides every limit of req all-or-nothing and fills resp.
	// Overrides apply to the per-user limits of req first.
	Check(ctx context.Context, req *rules.CheckRequest, resp *rules.CheckResponse) error
	// Status reports the state of the counter with base key key without
	// consuming. Decision.Allowed tells whether one more unit would pass.
	Status(ctx context.Context, key string, spec rules.LimitSpec) (rules.Decision, int64, error)
	// Reset forgets the counters and penalties of the given base keys.
	Reset(ctx context.Context, keys ...string) error
	// SetOverride stores o and returns the override it replaced, if any.
	SetOverride(ctx context.Context, o Override) (prev Override, had bool, err error)
	// Override returns the override that applies to (user, endpoint).
	Override(user, endpoint string) (Override, bool)
	Ping(ctx context.Context) error
	Close() error
}

// ErrUnavailable wraps every failure to reach the backing store, so the HTTP
// layer can answer 503 rather than 500.
var ErrUnavailable = errors.New("store unavailable")

// Override replaces the spec of per-user limits for one user on one endpoint
// ("*" for every endpoint). Cost and penalty of the limit are kept.
type Override struct {
	User      string          `json:"user_id"`
	Endpoint  string          `json:"endpoint"`
	Algorithm rules.Algorithm `json:"-"`
	Limit     int64           `json:"limit"`
	WindowMS  int64           `json:"window_ms"`
	Burst     int64           `json:"burst,omitempty"`
	UpdatedMS int64           `json:"updated_ms"`
}

// Apply returns spec with o's values.
func (o *Override) Apply(spec rules.LimitSpec) rules.LimitSpec {
	spec.Algorithm = o.Algorithm
	spec.Limit = o.Limit
	spec.WindowMS = o.WindowMS
	spec.Burst = o.Burst
	if spec.Burst <= 0 {
		spec.Burst = o.Limit
	}
	return spec
}

// overrideTable is an immutable set of overrides, swapped as a whole.
type overrideTable map[overrideKey]Override

type overrideKey struct{ user, endpoint string }

func (t overrideTable) lookup(user, endpoint string) (Override, bool) {
	if len(t) == 0 {
		return Override{}, false
	}
	if o, ok := t[overrideKey{user, endpoint}]; ok {
		return o, true
	}
	o, ok := t[overrideKey{user, "*"}]
	return o, ok
}

// apply replaces the spec of every per-user limit of req that has an override.
func (t overrideTable) apply(req *rules.CheckRequest) {
	if len(t) == 0 || req.User == "" {
		return
	}
	o, ok := t.lookup(req.User, req.Endpoint)
	if !ok {
		return
	}
	for i := range req.Limits {
		if req.Limits[i].PerUser {
			req.Limits[i].Spec = o.Apply(req.Limits[i].Spec)
		}
	}
}

// Suffixes the bridge appends to a base key. The algorithm is part of the
// counter key so that an override changing the algorithm never meets a key
// of another Redis type.
const (
	suffixViolations = ":v"
	suffixBlock      = ":b"
)

func algSuffix(a rules.Algorithm) string {
	switch a {
	case rules.TokenBucket:
		return ":tb"
	case rules.SlidingWindow:
		return ":sw"
	case rules.SlidingLog:
		return ":sl"
	case rules.FixedWindow:
		return ":fw"
	}
	return ":x" + strconv.Itoa(int(a))
}

// allSuffixes lists every key a base key may own, for Reset.
var allSuffixes = [...]string{":tb", ":sw", ":sl", ":fw", suffixViolations, suffixBlock}
