// Package store keeps Sluice's rate limit counters. Two stores implement one
// interface with the same algorithms and rounding: Redis (check.lua, one
// EVALSHA per check; script.go is its contract) and memory (one bridge, an
// injected clock). A test drives both with the same clock and random
// checks and requires identical answers.
package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// Store decides checks against shared counters. It applies the limits it
// is given as they are: overrides are the caller's business.
//
// A check's deadline is a value of its own rather than ctx's: a context
// with a deadline costs a timer and four allocations per check, and the
// Redis store enforces deadlines in its pipelines anyway. ctx cancels
// (the client went away); a zero deadline means the store's own timeout.
type Store interface {
	// Check decides every limit of req all-or-nothing and fills resp.
	Check(ctx context.Context, deadline time.Time, req *rules.CheckRequest, resp *rules.CheckResponse) error
	// Peek reports the state of the counter of l without consuming.
	// Decision.Allowed tells whether one more unit would pass.
	Peek(ctx context.Context, deadline time.Time, l *rules.LimitRequest) (rules.Decision, error)
	// Reset forgets the counters and penalties of the base key.
	Reset(ctx context.Context, key string) error
	Ping(ctx context.Context) error
	Close() error
}

// ErrUnavailable wraps every failure to reach the backing store, so the HTTP
// layer can answer 503 rather than 500.
var ErrUnavailable = errors.New("store unavailable")

// Suffixes the bridge appends to a base key. The algorithm is part of the
// counter key so that an override changing the algorithm never meets a key
// of another Redis type.
const (
	suffixViolations = ":v"
	suffixBlock      = ":b"
)

// keySuffix is the suffix of a limit's counter key: its algorithm's, and
// for a fixed window of calendar months, which counts windows of another
// kind, its own.
func keySuffix(s *rules.LimitSpec) string {
	switch s.Algorithm {
	case rules.TokenBucket:
		return ":tb"
	case rules.SlidingWindow:
		return ":sw"
	case rules.SlidingLog:
		return ":sl"
	case rules.FixedWindow:
		if s.Months > 0 {
			return ":fm"
		}
		return ":fw"
	}
	return ":x" + strconv.Itoa(int(s.Algorithm))
}

// allSuffixes lists every key a base key may own, for Reset.
var allSuffixes = [...]string{":tb", ":sw", ":sl", ":fw", ":fm", suffixViolations, suffixBlock}
