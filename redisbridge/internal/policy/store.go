// Package policy keeps the bridge's policy in PostgreSQL: the rules it
// serves to plugins, the per-user overrides it applies to checks, and an
// append-only audit trail of every change, each written in the change's
// own transaction.
//
// Checks never wait on PostgreSQL: a Store holds the policy in memory as
// an immutable Snapshot and follows the database from a goroutine of its
// own, told of changes by LISTEN/NOTIFY and, should a notification be
// lost, by comparing the policy's version every poll. While PostgreSQL
// cannot be reached, the last snapshot stays in force.
package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/rules"
)

// ErrUnavailable wraps every failure to reach PostgreSQL (or to complete
// a statement there): the API answers 503 and the caller may retry.
var ErrUnavailable = errors.New("policy store unavailable")

// notifyChannel is the channel every change notifies, with its version.
const notifyChannel = "sluice_policy"

// Options configure a Store.
type Options struct {
	URL string // postgres:// or postgresql://
	// Poll is how often the version is compared when no notification
	// came, default 1s: a lost notification delays a change by at most
	// this much.
	Poll time.Duration
	// Retry is the wait before connecting again after a failure, default 1s.
	Retry time.Duration
	// Timeout bounds each statement and transaction, default 5s.
	Timeout    time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer // metrics; nil: not registered

	migrateTo int    // tests: stop at this schema version (0: all)
	onWait    func() // tests: called when a call starts waiting for the schema
}

// Snapshot is the policy at one version. It never changes once made.
type Snapshot struct {
	rules.PolicyVersion
	Rules     []Rule // by priority, then name
	Overrides []overrides.Override
	// Doc is the policy document plugins fetch (rules.Config.WithPolicy):
	// {"store","version","rules"}.
	Doc []byte
}

// Store is a policy store. Its methods are safe for concurrent use.
type Store struct {
	opts Options
	cfg  *pgxpool.Config
	pool *pgxpool.Pool
	log  *slog.Logger
	m    *metrics

	snap     atomic.Pointer[Snapshot]
	mu       sync.Mutex    // guards changed and installs
	changed  chan struct{} // closed when a new snapshot is installed
	loaded   chan struct{} // closed at the first snapshot
	migrated chan struct{} // closed once the schema is migrated

	stateMu sync.Mutex
	state   Status

	backendStore atomic.Pointer[string] // store id the overrides backend last loaded

	stop context.CancelFunc
	done chan struct{}
}

// Status is what a bridge reports of its policy store (/readyz).
type Status struct {
	// State is "loading" (no policy read yet), "current" (following the
	// database) or "unreachable" (the last policy read stays in force).
	State   string `json:"state"`
	Store   string `json:"store,omitempty"`
	Version int64  `json:"version"`
	Since   string `json:"since,omitempty"` // RFC 3339: when it became unreachable
	Error   string `json:"error,omitempty"`
}

// Open returns a Store for opts.URL and starts following it: the schema
// is migrated and the policy read in the background, so a database that
// is down does not stop the bridge. Only a URL that cannot be parsed is
// an error.
func Open(opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opts.Timeout
	}
	cfg.MaxConns = 4 // admin writes and snapshot reads only; checks never come here
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{opts: opts, cfg: cfg, pool: pool, log: opts.Logger, m: newMetrics(opts.Registerer),
		changed: make(chan struct{}), loaded: make(chan struct{}), migrated: make(chan struct{}), done: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.state = Status{State: "loading"}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go s.follow(ctx)
	return s, nil
}

// Close stops following the database and closes its connections.
func (s *Store) Close() {
	s.stop()
	<-s.done
	s.pool.Close()
}

// Snapshot returns the policy in force, nil before the first read.
func (s *Store) Snapshot() *Snapshot { return s.snap.Load() }

// Loaded is closed once the first snapshot is read.
func (s *Store) Loaded() <-chan struct{} { return s.loaded }

// Status reports how the store is followed.
func (s *Store) Status() Status {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st := s.state
	if snap := s.snap.Load(); snap != nil {
		st.Store, st.Version = snap.Store, snap.Version
	} else if st.State == "current" {
		st.State = "loading" // the first snapshot is read, not yet in force
	}
	return st
}

// follow keeps the snapshot current until ctx ends: one session at a time,
// a new one after a failure.
func (s *Store) follow(ctx context.Context) {
	defer close(s.done)
	for {
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		s.unreachable(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.opts.Retry):
		}
	}
}

// session connects, migrates (once per Store), listens for changes and
// reads a new snapshot whenever the version moved, until an error.
func (s *Store) session(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	conn, err := pgx.ConnectConfig(cctx, s.cfg.ConnConfig)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if !s.isMigrated() {
		cctx, cancel := context.WithTimeout(ctx, 4*s.opts.Timeout)
		from, now, err := migrate(cctx, conn, s.opts.migrateTo)
		cancel()
		if err != nil {
			return fmt.Errorf("migrating the schema: %w", err)
		}
		if now != from {
			s.log.Info("policy store: schema migrated", "from", from, "to", now)
		} else if now > SchemaVersion() {
			s.log.Warn("policy store: the schema is newer than this bridge's; using it as it is", "schema", now, "bridge", SchemaVersion())
		}
		close(s.migrated)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	for {
		snap, err := s.refresh(ctx, conn)
		if err != nil {
			return err
		}
		// Reachable before the first snapshot is in force: whoever
		// waits on Loaded then finds the state current, not the last
		// session's error.
		s.reachable()
		if snap != nil {
			s.install(snap)
		}
		wctx, cancel := context.WithTimeout(ctx, s.opts.Poll)
		_, err = conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && wctx.Err() == nil {
			return err
		}
	}
}

// refresh reads a new snapshot when the database's version differs from
// the one in force; nil when it does not.
func (s *Store) refresh(ctx context.Context, conn *pgx.Conn) (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	var v rules.PolicyVersion
	if err := conn.QueryRow(ctx, "SELECT store_id, version FROM sluice_policy").Scan(&v.Store, &v.Version); err != nil {
		return nil, err
	}
	if cur := s.snap.Load(); cur != nil && cur.PolicyVersion == v {
		return nil, nil
	}
	return load(ctx, conn)
}

// isMigrated tells whether this Store has migrated the schema.
func (s *Store) isMigrated() bool {
	select {
	case <-s.migrated:
		return true
	default:
		return false
	}
}

// schemaReady waits until the schema is migrated or ctx ends. Writes and
// audit reads call it first: a bridge that has just started, or whose
// migration waits on another bridge's, answers them once its tables exist
// rather than failing on tables that are not there yet.
func (s *Store) schemaReady(ctx context.Context) error {
	if s.isMigrated() {
		return nil
	}
	if s.opts.onWait != nil {
		s.opts.onWait()
	}
	select {
	case <-s.migrated:
		return nil
	case <-ctx.Done():
		if last := s.Status().Error; last != "" {
			return fmt.Errorf("%w: the schema is not migrated yet (last error: %s): %w", ErrUnavailable, last, ctx.Err())
		}
		return fmt.Errorf("%w: the schema is not migrated yet: %w", ErrUnavailable, ctx.Err())
	}
}

// reload reads a snapshot through the pool: a bridge that made a change
// serves it before it answers.
func (s *Store) reload(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	snap, err := load(ctx, conn.Conn())
	if err != nil {
		return err
	}
	s.install(snap)
	return nil
}

// install makes snap the policy in force unless the one in force is as new.
func (s *Store) install(snap *Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.snap.Load()
	if cur != nil && !snap.Newer(cur.PolicyVersion) {
		return
	}
	s.snap.Store(snap)
	close(s.changed)
	s.changed = make(chan struct{})
	if cur == nil {
		close(s.loaded)
	}
	s.m.version.Set(float64(snap.Version))
	s.m.reloads.Inc()
}

func (s *Store) changedChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Store) reachable() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if s.state.Error != "" {
		s.log.Info("policy store: reachable again", "unreachable_since", s.state.Since)
	}
	s.state = Status{State: "current"}
	s.m.up.Set(1)
}

// unreachable records a failed session: logged when it starts, counted
// every time. Before the first snapshot the state stays "loading".
func (s *Store) unreachable(err error) {
	s.m.errors.WithLabelValues("follow").Inc()
	s.m.up.Set(0)
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	snap := s.snap.Load()
	if s.state.Error == "" {
		v := int64(-1)
		if snap != nil {
			v = snap.Version
		}
		s.log.Error("policy store: unreachable; the last policy read stays in force", "version", v, "err", err.Error())
		s.state.Since = time.Now().UTC().Format(time.RFC3339)
	}
	s.state.State = "unreachable"
	if snap == nil {
		s.state.State = "loading"
	}
	s.state.Error = err.Error()
}

// load reads the whole policy in one repeatable-read transaction, so the
// rules and overrides are those of the version read with them.
func load(ctx context.Context, conn *pgx.Conn) (*Snapshot, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	snap := &Snapshot{}
	if err := tx.QueryRow(ctx, "SELECT store_id, version FROM sluice_policy").Scan(&snap.Store, &snap.Version); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, "SELECT "+ruleColumns+" FROM sluice_rules")
	if err != nil {
		return nil, err
	}
	snap.Rules, err = pgx.CollectRows(rows, scanRule)
	if err != nil {
		return nil, err
	}
	sort.Slice(snap.Rules, func(i, j int) bool {
		a, b := &snap.Rules[i], &snap.Rules[j]
		return a.Priority < b.Priority || a.Priority == b.Priority && a.Name < b.Name
	})
	rows, err = tx.Query(ctx, "SELECT "+overrideColumns+" FROM sluice_overrides")
	if err != nil {
		return nil, err
	}
	snap.Overrides, err = pgx.CollectRows(rows, scanOverride)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	snap.Doc, err = json.Marshal(struct {
		Store   string `json:"store"`
		Version int64  `json:"version"`
		Rules   []Rule `json:"rules"`
	}{snap.Store, snap.Version, append([]Rule{}, snap.Rules...)})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

const ruleColumns = "name, scope, algorithm, limit_count, window_ms, window_months, burst, cost, paths, methods, hosts, headers, query, penalty, lease, on_response, action, max_delay_ms, priority, enabled, created_at, updated_at, updated_by"

func scanRule(row pgx.CollectableRow) (Rule, error) {
	var r Rule
	var burst, maxDelay *int64
	err := row.Scan(&r.Name, &r.Scope, &r.Algorithm, &r.Limit, &r.WindowMS, &r.WindowMonths, &burst, &r.Cost, &r.Paths, &r.Methods,
		&r.Hosts, &r.Headers, &r.Query, &r.Penalty, &r.Lease, &r.OnResponse, &r.Action, &maxDelay, &r.Priority, &r.Enabled, &r.CreatedAt, &r.UpdatedAt, &r.UpdatedBy)
	if burst != nil {
		r.Burst = *burst
	}
	if maxDelay != nil {
		r.MaxDelayMS = *maxDelay
	}
	if len(r.Paths) == 0 {
		r.Paths = nil
	}
	if len(r.Methods) == 0 {
		r.Methods = nil
	}
	if len(r.Hosts) == 0 {
		r.Hosts = nil
	}
	return r, err
}

const overrideColumns = "user_id, endpoint, algorithm, limit_count, window_ms, burst, updated_at, window_months"

func scanOverride(row pgx.CollectableRow) (overrides.Override, error) {
	var o overrides.Override
	var alg string
	var burst *int64
	var at time.Time
	err := row.Scan(&o.User, &o.Endpoint, &alg, &o.Limit, &o.WindowMS, &burst, &at, &o.Months)
	o.Algorithm, _ = rules.ParseAlgorithm(alg)
	if burst != nil {
		o.Burst = *burst
	}
	o.UpdatedMS = at.UnixMilli()
	return o, err
}

type metrics struct {
	version prometheus.Gauge
	up      prometheus.Gauge
	reloads prometheus.Counter
	errors  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_bridge_policy_version", Help: "Version of the policy in force (--policy-store).",
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_bridge_policy_store_up", Help: "1 while the bridge follows the policy store, 0 while it cannot reach it and the last policy read stays in force.",
		}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_bridge_policy_reloads_total", Help: "Policy snapshots read after a change.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bridge_policy_errors_total", Help: "Policy store failures by operation (follow, write, audit).",
		}, []string{"op"}),
	}
	for _, op := range []string{"follow", "write", "audit"} {
		m.errors.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(m.version, m.up, m.reloads, m.errors)
	}
	return m
}
