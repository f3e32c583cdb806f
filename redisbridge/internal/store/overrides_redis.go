package store

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/rules"
)

// overridesKey holds one field per override plus the "version" counter that
// bridges poll to notice changes.
const overridesKey = "sluice:overrides"

// redisOverrides keeps overrides in the Redis hash sluice:overrides, so
// every bridge on the same Redis applies them. Checks stay one command
// each: bridges read one field (the version) per poll, and the whole hash
// only when it changed.
type redisOverrides struct {
	c       redis.UniversalClient
	timeout time.Duration
	every   time.Duration
	log     *slog.Logger
}

// Overrides returns an overrides backend on this store's Redis that looks
// for changes every poll (default 1s).
func (s *Redis) Overrides(poll time.Duration) overrides.Backend {
	if poll <= 0 {
		poll = time.Second
	}
	return &redisOverrides{c: s.c, timeout: s.timeout, every: poll, log: s.log}
}

// storedOverride is an override as the hash field's value holds it.
type storedOverride struct {
	User      string `json:"user_id"`
	Endpoint  string `json:"endpoint"`
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	WindowMS  int64  `json:"window_ms"`
	Burst     int64  `json:"burst,omitempty"`
	UpdatedMS int64  `json:"updated_ms"`
	Months    int64  `json:"window_months,omitempty"`
	// Strategy is the algorithm as bridges before the rename to
	// "algorithm" wrote it; read so that their overrides stay in force.
	Strategy string `json:"strategy,omitempty"`
}

func overrideField(user, endpoint string) string {
	b, _ := json.Marshal([2]string{user, endpoint})
	return string(b)
}

func encodeOverride(o overrides.Override) ([]byte, error) {
	return json.Marshal(storedOverride{
		User: o.User, Endpoint: o.Endpoint, Algorithm: o.Algorithm.String(), Limit: o.Limit,
		WindowMS: o.WindowMS, Burst: o.Burst, UpdatedMS: o.UpdatedMS, Months: o.Months,
	})
}

func decodeOverride(raw []byte) (overrides.Override, bool) {
	var so storedOverride
	if err := json.Unmarshal(raw, &so); err != nil {
		return overrides.Override{}, false
	}
	name := so.Algorithm
	if name == "" {
		name = so.Strategy
	}
	alg, _ := rules.ParseAlgorithm(name)
	o := overrides.Override{
		User: so.User, Endpoint: so.Endpoint, Algorithm: alg, Limit: so.Limit,
		WindowMS: so.WindowMS, Burst: so.Burst, UpdatedMS: so.UpdatedMS, Months: so.Months,
	}
	return o, o.Valid()
}

// Load implements overrides.Backend.
func (r *redisOverrides) Load(ctx context.Context) (int64, []overrides.Override, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	all, err := r.c.HGetAll(ctx, overridesKey).Result()
	if err != nil {
		return 0, nil, storeErr(err)
	}
	var v int64
	list := make([]overrides.Override, 0, len(all))
	for f, raw := range all {
		if f == "version" {
			v, _ = strconv.ParseInt(raw, 10, 64)
			continue
		}
		if o, ok := decodeOverride([]byte(raw)); ok {
			list = append(list, o)
		} else {
			r.log.Warn("ignoring a malformed override", "key", overridesKey, "field", f)
		}
	}
	return v, list, nil
}

// Put implements overrides.Backend. The override and the version bump go
// in one MULTI, so a bridge that sees the new version reads the new
// override.
func (r *redisOverrides) Put(ctx context.Context, o overrides.Override) (overrides.Override, bool, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	val, err := encodeOverride(o)
	if err != nil {
		return overrides.Override{}, false, 0, err
	}
	field := overrideField(o.User, o.Endpoint)
	var prevCmd *redis.StringCmd
	var verCmd *redis.IntCmd
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		prevCmd = p.HGet(ctx, overridesKey, field)
		p.HSet(ctx, overridesKey, field, val)
		verCmd = p.HIncrBy(ctx, overridesKey, "version", 1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return overrides.Override{}, false, 0, storeErr(err)
	}
	var prev overrides.Override
	had := false
	if raw, err := prevCmd.Bytes(); err == nil {
		prev, had = decodeOverride(raw)
	}
	return prev, had, verCmd.Val(), nil
}

// Delete implements overrides.Backend: the field and the version bump go
// in one MULTI, as for Put.
func (r *redisOverrides) Delete(ctx context.Context, user, endpoint string) (overrides.Override, bool, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	field := overrideField(user, endpoint)
	var prevCmd *redis.StringCmd
	var verCmd *redis.IntCmd
	_, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		prevCmd = p.HGet(ctx, overridesKey, field)
		p.HDel(ctx, overridesKey, field)
		verCmd = p.HIncrBy(ctx, overridesKey, "version", 1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return overrides.Override{}, false, 0, storeErr(err)
	}
	raw, err := prevCmd.Bytes()
	if err != nil {
		return overrides.Override{}, false, verCmd.Val(), nil
	}
	prev, had := decodeOverride(raw)
	return prev, had, verCmd.Val(), nil
}

// Wait implements overrides.Backend: it reads the version every poll
// until it differs.
func (r *redisOverrides) Wait(ctx context.Context, version int64) error {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		v, err := r.version(ctx)
		if err != nil {
			return err
		}
		if v != version {
			return nil
		}
	}
}

func (r *redisOverrides) version(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	v, err := r.c.HGet(ctx, overridesKey, "version").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, storeErr(err)
	}
	return v, nil
}
