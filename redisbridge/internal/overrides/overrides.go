// Package overrides keeps the per-user limits set through the bridge's
// config API: an override replaces the spec of the per-user limits of
// checks for one user on one endpoint (or on every endpoint, "*").
//
// A Set holds the overrides in memory, so applying them costs a map
// lookup and no I/O, and keeps them current from a Backend: the durable
// store the config API writes to and other bridges read from. When the
// backend cannot be read the Set keeps applying the last overrides it
// read.
package overrides

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/rules"
)

// AllEndpoints is the endpoint of an override for every endpoint of a user.
const AllEndpoints = "*"

// Override replaces the spec of per-user limits for one user on one
// endpoint. Cost and penalty of the limit are kept.
type Override struct {
	User      string
	Endpoint  string // a request path, or AllEndpoints
	Algorithm rules.Algorithm
	Limit     int64
	WindowMS  int64
	Burst     int64 // token bucket capacity; 0: Limit
	UpdatedMS int64 // unix ms of the write
	// Months makes a fixed_window's windows calendar months
	// (rules.LimitSpec.Months); WindowMS is then their nominal length.
	Months int64
}

// Apply returns spec with o's values.
func (o *Override) Apply(spec rules.LimitSpec) rules.LimitSpec {
	spec.Algorithm = o.Algorithm
	spec.Limit = o.Limit
	spec.WindowMS, spec.Months = o.WindowMS, o.Months
	spec.Burst = o.Burst
	if spec.Burst <= 0 {
		spec.Burst = o.Limit
	}
	return spec
}

// MarshalJSON writes o as the config API shows it: user_id, endpoint,
// limit, window_seconds or window_months, algorithm, burst_capacity (when
// set) and updated_at (RFC 3339). The API's answers and the audit trail
// use it.
func (o Override) MarshalJSON() ([]byte, error) {
	v := struct {
		User      string `json:"user_id"`
		Endpoint  string `json:"endpoint"`
		Limit     int64  `json:"limit"`
		Window    int64  `json:"window_seconds,omitempty"`
		Months    int64  `json:"window_months,omitempty"`
		Algorithm string `json:"algorithm"`
		Burst     int64  `json:"burst_capacity,omitempty"`
		Updated   string `json:"updated_at"`
	}{o.User, o.Endpoint, o.Limit, o.WindowMS / 1000, o.Months, o.Algorithm.String(), o.Burst,
		time.UnixMilli(o.UpdatedMS).UTC().Format(time.RFC3339)}
	if o.Months > 0 {
		v.Window = 0
	}
	return json.Marshal(v)
}

// Valid reports whether o can be applied: a backend skips stored
// overrides that are not (written by hand, or by a newer bridge).
func (o *Override) Valid() bool {
	return o.User != "" && o.Endpoint != "" && o.Algorithm.String() != "" &&
		o.Limit >= 1 && o.Limit <= rules.MaxLimitValue &&
		o.WindowMS >= 1 && o.WindowMS <= rules.MaxWindowMS &&
		o.Burst >= 0 && o.Burst <= rules.MaxLimitValue &&
		(o.Months == 0 || rules.ValidMonths(o.Months) && o.Algorithm == rules.FixedWindow && o.WindowMS == o.Months*rules.MonthMS)
}

// Backend is where overrides are kept. Versions order the backend's
// states: every Put makes a new one, one higher.
type Backend interface {
	// Load returns every stored override and the version they are at.
	Load(ctx context.Context) (version int64, all []Override, err error)
	// Put stores o, replacing the override of the same user and endpoint,
	// and returns the replaced one (had false: none) and the version the
	// write made.
	Put(ctx context.Context, o Override) (prev Override, had bool, version int64, err error)
	// Delete removes the override of user and endpoint and returns it
	// (had false: there was none, and nothing changed).
	Delete(ctx context.Context, user, endpoint string) (prev Override, had bool, version int64, err error)
	// Wait returns once the stored overrides may be at another version
	// than version (another bridge wrote), or with ctx's error.
	Wait(ctx context.Context, version int64) error
}

// Set is the overrides in force in this bridge.
type Set struct {
	b       Backend
	log     *slog.Logger
	table   atomic.Pointer[table]
	version atomic.Int64 // of the backend state the table holds; -1: none read yet
	loaded  chan struct{}
	retry   time.Duration // after a failed read of the backend
	stop    context.CancelFunc
	done    chan struct{}
}

type key struct{ user, endpoint string }

// table is an immutable set of overrides, swapped as a whole.
type table map[key]Override

// retryEvery is how long a Set waits after a failed read of its backend.
const retryEvery = time.Second

// New returns a Set kept current from b until Close.
func New(b Backend, log *slog.Logger) *Set { return newSet(b, log, retryEvery) }

func newSet(b Backend, log *slog.Logger, retry time.Duration) *Set {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Set{b: b, log: log, loaded: make(chan struct{}), retry: retry, stop: cancel, done: make(chan struct{})}
	s.table.Store(&table{})
	s.version.Store(-1)
	go s.follow(ctx)
	return s
}

// Close stops following the backend.
func (s *Set) Close() {
	s.stop()
	<-s.done
}

// Loaded is closed once the Set has read its backend for the first time.
func (s *Set) Loaded() <-chan struct{} { return s.loaded }

// follow reads the backend whenever it may have changed.
func (s *Set) follow(ctx context.Context) {
	defer close(s.done)
	first := true
	for {
		if err := s.reload(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("overrides: reading them failed; the last ones read stay in force", "err", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.retry):
			}
			continue
		}
		if first {
			close(s.loaded)
			first = false
		}
		if err := s.b.Wait(ctx, s.version.Load()); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("overrides: watching for changes failed", "err", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.retry):
			}
		}
	}
}

func (s *Set) reload(ctx context.Context) error {
	v, all, err := s.b.Load(ctx)
	if err != nil {
		return err
	}
	t := make(table, len(all))
	for _, o := range all {
		t[key{o.User, o.Endpoint}] = o
	}
	s.table.Store(&t)
	s.version.Store(v)
	return nil
}

// Put stores o through the backend and applies it in this bridge at once;
// other bridges apply it once their backend tells them.
func (s *Set) Put(ctx context.Context, o Override) (prev Override, had bool, err error) {
	prev, had, v, err := s.b.Put(ctx, o)
	if err != nil {
		return Override{}, false, err
	}
	s.update(v, func(t table) { t[key{o.User, o.Endpoint}] = o })
	return prev, had, nil
}

// Delete removes the override of user and endpoint through the backend
// and in this bridge at once; other bridges follow as for Put.
func (s *Set) Delete(ctx context.Context, user, endpoint string) (prev Override, had bool, err error) {
	prev, had, v, err := s.b.Delete(ctx, user, endpoint)
	if err != nil || !had {
		return Override{}, false, err
	}
	s.update(v, func(t table) { delete(t, key{user, endpoint}) })
	return prev, true, nil
}

// update applies this bridge's own write, which made backend version v,
// to a copy of the table.
func (s *Set) update(v int64, change func(table)) {
	for {
		old := s.table.Load()
		t := make(table, len(*old)+1)
		for k, x := range *old {
			t[k] = x
		}
		change(t)
		if s.table.CompareAndSwap(old, &t) {
			break
		}
	}
	// Only a reload sees writes of other bridges: the version may move on
	// here only when this write is the one step after what was read.
	s.version.CompareAndSwap(v-1, v)
}

// Get returns the override stored for exactly (user, endpoint).
func (s *Set) Get(user, endpoint string) (Override, bool) {
	o, ok := (*s.table.Load())[key{user, endpoint}]
	return o, ok
}

// Lookup returns the override that applies to a check for user on
// endpoint: the one for that endpoint, else the one for AllEndpoints.
func (s *Set) Lookup(user, endpoint string) (Override, bool) {
	t := *s.table.Load()
	if len(t) == 0 || user == "" {
		return Override{}, false
	}
	if o, ok := t[key{user, endpoint}]; ok {
		return o, true
	}
	o, ok := t[key{user, AllEndpoints}]
	return o, ok
}

// All returns every override in force in this bridge.
func (s *Set) All() []Override {
	t := *s.table.Load()
	out := make([]Override, 0, len(t))
	for _, o := range t {
		out = append(out, o)
	}
	return out
}

// Apply replaces the spec of every per-user limit of req with the override
// for (req.User, req.Endpoint), if there is one.
func (s *Set) Apply(req *rules.CheckRequest) {
	o, ok := s.Lookup(req.User, req.Endpoint)
	if !ok {
		return
	}
	for i := range req.Limits {
		if req.Limits[i].PerUser {
			req.Limits[i].Spec = o.Apply(req.Limits[i].Spec)
		}
	}
}

// Memory is a Backend in this process: for a bridge with the memory
// store, which has no other bridges to share overrides with.
type Memory struct {
	mu      sync.Mutex
	m       map[key]Override
	version int64
}

// NewMemory returns an empty memory backend.
func NewMemory() *Memory { return &Memory{m: map[key]Override{}} }

// Load implements Backend.
func (m *Memory) Load(context.Context) (int64, []Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make([]Override, 0, len(m.m))
	for _, o := range m.m {
		all = append(all, o)
	}
	return m.version, all, nil
}

// Put implements Backend.
func (m *Memory) Put(_ context.Context, o Override) (Override, bool, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, had := m.m[key{o.User, o.Endpoint}]
	m.m[key{o.User, o.Endpoint}] = o
	m.version++
	return prev, had, m.version, nil
}

// Delete implements Backend.
func (m *Memory) Delete(_ context.Context, user, endpoint string) (Override, bool, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, had := m.m[key{user, endpoint}]
	if !had {
		return Override{}, false, m.version, nil
	}
	delete(m.m, key{user, endpoint})
	m.version++
	return prev, true, m.version, nil
}

// Wait implements Backend: only this bridge writes, and its Set applies
// its own writes, so there is nothing to wait for.
func (m *Memory) Wait(ctx context.Context, _ int64) error {
	<-ctx.Done()
	return ctx.Err()
}
