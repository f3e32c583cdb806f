package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/rules"
)

// Change says who makes a change: the audit record written with it.
type Change struct {
	Who       string // the admin key's fingerprint
	Remote    string // the client's address
	RequestID string
}

type changeKey struct{}

// WithChange returns ctx carrying c, for the writes of the overrides
// backend (overrides.Backend has no room for it).
func WithChange(ctx context.Context, c Change) context.Context {
	return context.WithValue(ctx, changeKey{}, c)
}

// ErrTooManyRules refuses a rule beyond what one check can carry.
var ErrTooManyRules = fmt.Errorf("the policy store holds %d rules, as many as the plugin accepts (all rules and categories that match one request are checked in one call)", MaxRules)

// MaxRules is the most rules the store holds: a plugin configuration takes
// at most 63 rules and categories together.
const MaxRules = rules.MaxLimitsPerCheck - 1

// Audit actions: the admin API's names for them.
const (
	ActionRulePut        = "rule.put"
	ActionRuleDelete     = "rule.delete"
	ActionOverridePut    = "config.put"
	ActionOverrideDelete = "config.delete"
)

// change runs fn in one transaction that bumps the policy's version,
// writes the audit record fn returns (nil: fn changed nothing, and the
// transaction is rolled back) and notifies the other bridges. After the
// commit this bridge reads the new snapshot, so what it serves includes
// the change when the caller answers.
func (s *Store) change(ctx context.Context, c Change, fn func(ctx context.Context, tx pgx.Tx) (*auditEntry, error)) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.schemaReady(ctx); err != nil {
		s.m.errors.WithLabelValues("write").Inc()
		return 0, err
	}
	var version int64
	var store string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "UPDATE sluice_policy SET version = version + 1 RETURNING store_id, version").Scan(&store, &version); err != nil {
			return err
		}
		a, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if a == nil {
			return errNothing
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sluice_audit (who, remote, request_id, action, target, before, after, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, c.Who, c.Remote, c.RequestID, a.action, a.target, a.before, a.after, version); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "SELECT pg_notify($1, $2)", notifyChannel, fmt.Sprint(version))
		return err
	})
	if errors.Is(err, errNothing) {
		return 0, nil
	}
	if err != nil {
		if errors.Is(err, ErrTooManyRules) {
			return 0, err
		}
		s.m.errors.WithLabelValues("write").Inc()
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := s.reload(ctx); err != nil {
		// Committed: the follower reads it once the database answers again.
		s.log.Warn("policy store: reading the policy after a change failed", "version", version, "err", err.Error())
	}
	return version, nil
}

var errNothing = errors.New("nothing changed")

type auditEntry struct {
	action, target string
	before, after  []byte // JSON; nil: none
}

func jsonOf(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// PutRule stores r, replacing the rule of the same name, and returns the
// replaced one (had false: none) and the version the change made.
func (s *Store) PutRule(ctx context.Context, r Rule, c Change) (prev Rule, had bool, version int64, err error) {
	version, err = s.change(ctx, c, func(ctx context.Context, tx pgx.Tx) (*auditEntry, error) {
		rows, err := tx.Query(ctx, "SELECT "+ruleColumns+" FROM sluice_rules WHERE name = $1", r.Name)
		if err != nil {
			return nil, err
		}
		old, err := pgx.CollectRows(rows, scanRule)
		if err != nil {
			return nil, err
		}
		if had = len(old) == 1; had {
			prev = old[0]
		} else {
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM sluice_rules").Scan(&n); err != nil {
				return nil, err
			}
			if n >= MaxRules {
				return nil, ErrTooManyRules
			}
		}
		var burst *int64
		if r.Burst > 0 {
			burst = &r.Burst
		}
		var maxDelay *int64
		if r.MaxDelayMS > 0 {
			maxDelay = &r.MaxDelayMS
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sluice_rules (name, scope, algorithm, limit_count, window_ms, burst, cost, paths, methods, hosts, headers, penalty, action, priority, enabled, updated_by, lease, max_delay_ms, query, on_response, window_months)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
ON CONFLICT (name) DO UPDATE SET scope = $2, algorithm = $3, limit_count = $4, window_ms = $5, burst = $6, cost = $7,
    paths = $8, methods = $9, hosts = $10, headers = $11, penalty = $12, action = $13, priority = $14, enabled = $15,
    updated_at = now(), updated_by = $16, lease = $17, max_delay_ms = $18, query = $19, on_response = $20, window_months = $21`,
			r.Name, r.Scope, r.Algorithm, r.Limit, r.WindowMS, burst, r.Cost, nonNil(r.Paths), nonNil(r.Methods), nonNil(r.Hosts),
			nullJSON(r.Headers), nullJSON(r.Penalty), r.Action, r.Priority, r.Enabled, c.Who, nullJSON(r.Lease), maxDelay, nullJSON(r.Query), nullJSON(r.OnResponse), r.WindowMonths); err != nil {
			return nil, err
		}
		a := &auditEntry{action: ActionRulePut, target: r.Name, after: jsonOf(r)}
		if had {
			a.before = jsonOf(prev)
		}
		return a, nil
	})
	return prev, had, version, err
}

// DeleteRule removes the rule name and returns it (had false: there was
// none, and nothing changed).
func (s *Store) DeleteRule(ctx context.Context, name string, c Change) (prev Rule, had bool, version int64, err error) {
	version, err = s.change(ctx, c, func(ctx context.Context, tx pgx.Tx) (*auditEntry, error) {
		rows, err := tx.Query(ctx, "DELETE FROM sluice_rules WHERE name = $1 RETURNING "+ruleColumns, name)
		if err != nil {
			return nil, err
		}
		old, err := pgx.CollectRows(rows, scanRule)
		if err != nil || len(old) == 0 {
			return nil, err
		}
		prev, had = old[0], true
		return &auditEntry{action: ActionRuleDelete, target: name, before: jsonOf(prev)}, nil
	})
	return prev, had, version, err
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nullJSON(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// Overrides returns the overrides backend of this store: overrides.Set
// follows the store's snapshots, and its writes are changes here, each
// with its audit record. Their context must carry a Change (WithChange).
func (s *Store) Overrides() overrides.Backend { return backend{s} }

type backend struct{ s *Store }

// Load implements overrides.Backend: the overrides of the snapshot in
// force, waiting for the first one.
func (b backend) Load(ctx context.Context) (int64, []overrides.Override, error) {
	select {
	case <-b.s.loaded:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	snap := b.s.snap.Load()
	b.s.backendStore.Store(&snap.Store)
	return snap.Version, snap.Overrides, nil
}

// Wait implements overrides.Backend: until a snapshot newer than version
// is in force, or one of another database.
func (b backend) Wait(ctx context.Context, version int64) error {
	for {
		ch := b.s.changedChan()
		snap := b.s.snap.Load()
		if st := b.s.backendStore.Load(); snap != nil && (st == nil || *st != snap.Store || snap.Version > version) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func changeOf(ctx context.Context) (Change, error) {
	c, ok := ctx.Value(changeKey{}).(Change)
	if !ok {
		return c, errors.New("policy: a write without its Change (policy.WithChange)")
	}
	return c, nil
}

// Put implements overrides.Backend.
func (b backend) Put(ctx context.Context, o overrides.Override) (prev overrides.Override, had bool, version int64, err error) {
	c, err := changeOf(ctx)
	if err != nil {
		return prev, false, 0, err
	}
	version, err = b.s.change(ctx, c, func(ctx context.Context, tx pgx.Tx) (*auditEntry, error) {
		rows, err := tx.Query(ctx, "SELECT "+overrideColumns+" FROM sluice_overrides WHERE user_id = $1 AND endpoint = $2", o.User, o.Endpoint)
		if err != nil {
			return nil, err
		}
		old, err := pgx.CollectRows(rows, scanOverride)
		if err != nil {
			return nil, err
		}
		if had = len(old) == 1; had {
			prev = old[0]
		}
		var burst *int64
		if o.Burst > 0 {
			burst = &o.Burst
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sluice_overrides (user_id, endpoint, algorithm, limit_count, window_ms, burst, updated_at, updated_by, window_months)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (user_id, endpoint) DO UPDATE SET algorithm = $3, limit_count = $4, window_ms = $5, burst = $6, updated_at = $7, updated_by = $8, window_months = $9`,
			o.User, o.Endpoint, o.Algorithm.String(), o.Limit, o.WindowMS, burst, time.UnixMilli(o.UpdatedMS), c.Who, o.Months); err != nil {
			return nil, err
		}
		a := &auditEntry{action: ActionOverridePut, target: o.User + " " + o.Endpoint, after: jsonOf(o)}
		if had {
			a.before = jsonOf(prev)
		}
		return a, nil
	})
	return prev, had, version, err
}

// Delete implements overrides.Backend.
func (b backend) Delete(ctx context.Context, user, endpoint string) (prev overrides.Override, had bool, version int64, err error) {
	c, err := changeOf(ctx)
	if err != nil {
		return prev, false, 0, err
	}
	version, err = b.s.change(ctx, c, func(ctx context.Context, tx pgx.Tx) (*auditEntry, error) {
		rows, err := tx.Query(ctx, "DELETE FROM sluice_overrides WHERE user_id = $1 AND endpoint = $2 RETURNING "+overrideColumns, user, endpoint)
		if err != nil {
			return nil, err
		}
		old, err := pgx.CollectRows(rows, scanOverride)
		if err != nil || len(old) == 0 {
			return nil, err
		}
		prev, had = old[0], true
		return &auditEntry{action: ActionOverrideDelete, target: user + " " + endpoint, before: jsonOf(prev)}, nil
	})
	return prev, had, version, err
}
