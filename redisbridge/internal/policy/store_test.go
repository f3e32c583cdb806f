package policy

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/redisbridge/internal/overrides"
	"github.com/sluicehq/sluice/redisbridge/pgtest"
	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var who = Change{Who: "sha256:test", Remote: "192.0.2.1:4000", RequestID: "req-1"}

// open starts a Store on url and waits for its first snapshot.
func open(t *testing.T, url string, poll time.Duration) *Store {
	t.Helper()
	s, err := Open(Options{URL: url, Poll: poll, Retry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	select {
	case <-s.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatalf("no snapshot: %+v", s.Status())
	}
	return s
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func count(t *testing.T, c *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func mustRule(t *testing.T, body string) Rule {
	t.Helper()
	r, err := ParseRule([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return r
}

// waitVersion waits until s serves version v or later.
func waitVersion(t *testing.T, s *Store, v int64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ch := s.changedChan()
		if snap := s.Snapshot(); snap != nil && snap.Version >= v {
			return time.Since(start)
		}
		select {
		case <-ch:
		case <-time.After(within - time.Since(start)):
			t.Fatalf("version %d not reached in %v: %+v", v, within, s.Status())
		}
	}
}

func TestMigrate_FromEmpty(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	s := open(t, url, time.Second)
	if snap := s.Snapshot(); snap.Version != 0 || snap.Store == "" || len(snap.Rules)+len(snap.Overrides) != 0 {
		t.Fatalf("empty store: %+v", snap)
	}
	c := connect(t, url)
	if n := count(t, c, "SELECT max(version) FROM sluice_schema_migrations"); n != SchemaVersion() {
		t.Fatalf("schema at %d, want %d", n, SchemaVersion())
	}
	from, now, err := migrate(context.Background(), c, 0)
	if err != nil || from != SchemaVersion() || now != from {
		t.Fatalf("migrating again: %d → %d, %v", from, now, err)
	}
}

// A database at the previous schema version, with data in it, is
// migrated by a bridge that starts on it, and the data stays.
func TestMigrate_FromPreviousVersion(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	c := connect(t, url)
	ctx := context.Background()
	if _, now, err := migrate(ctx, c, SchemaVersion()-1); err != nil || now != SchemaVersion()-1 {
		t.Fatalf("to the previous version: %d %v", now, err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO sluice_overrides VALUES ('alice', '*', 'token_bucket', 5, 60000, NULL, now(), 'sha256:x');
UPDATE sluice_policy SET version = 1;
INSERT INTO sluice_audit (who, remote, request_id, action, target, version) VALUES ('sha256:x', '', '', 'config.put', 'alice *', 1)`); err != nil {
		t.Fatal(err)
	}
	s := open(t, url, time.Second)
	snap := s.Snapshot()
	if snap.Version != 1 || len(snap.Overrides) != 1 || snap.Overrides[0].User != "alice" || snap.Overrides[0].Limit != 5 {
		t.Fatalf("after migrating: %+v", snap)
	}
	if _, _, v, err := s.PutRule(ctx, mustRule(t, `{"name":"r","limit":1,"window":"1m"}`), who); err != nil || v != 2 {
		t.Fatalf("a rule on the migrated schema: %d %v", v, err)
	}
	if n := count(t, c, "SELECT count(*) FROM sluice_audit"); n != 2 {
		t.Fatalf("%d audit records, want the old one and the new", n)
	}
}

// Bridges starting together on an empty database migrate it once.
func TestMigrate_Concurrent(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			c, err := pgx.Connect(context.Background(), url)
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close(context.Background())
			_, _, errs[i] = migrate(context.Background(), c, 0)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	c := connect(t, url)
	if n := count(t, c, "SELECT count(*) FROM sluice_schema_migrations"); n != SchemaVersion() {
		t.Fatalf("%d migrations recorded, want %d", n, SchemaVersion())
	}
	if n := count(t, c, "SELECT count(*) FROM sluice_policy"); n != 1 {
		t.Fatalf("%d policy rows", n)
	}
}

// A rule read from the API and written back as the policy serves it
// parses to the same rule in the plugin.
func TestRule_RoundTrip(t *testing.T) {
	for _, body := range []string{
		`{"name":"a","limit":1,"window":"1m"}`,
		`{"name":"b","limit":600,"window":"1m30s","algorithm":"token_bucket","burst":50,"cost":2,"scope":"endpoint+user","action":"log_only","priority":-5,"enabled":false}`,
		`{"name":"c","limit":10,"window":"1h","match":{"paths":["/api/**","prefix:/x","/a/*.json"],"methods":["get","Post"],"hosts":["*.Example.com"],
		  "headers":[{"name":"X-Key","present":false},{"name":"x-channel","equals":"beta","invert":true},{"name":"a","present":true}]}}`,
		`{"name":"d","limit":10,"window":"1m","penalty":{"violation_threshold":5,"multipliers":[1,2]}}`,
		`{"name":"e","limit":10,"window":"1m","penalty":{"enabled":false}}`,
		`{"name":"f","limit":10,"window":"1m","match":{"paths":["/x&y<z>"]}}`,
		`{"name":"g","limit":50,"window":"1s","algorithm":"sliding_log","action":"throttle","max_delay":"5s"}`,
		`{"name":"h","limit":50,"window":"1s","action":"throttle"}`,
		`{"name":"i","limit":10,"window":"1h","match":{"paths":["/reports/**"],"query":[{"name":"format","equals":"csv"},{"name":"a b","present":false}]}}`,
		`{"name":"j","limit":10,"window":"1h","match":{"headers":[{"name":"user-agent","prefix":"curl/"},{"name":"x-from","suffix":".internal","invert":true}],
		  "query":[{"name":"q","contains":"select"}]}}`,
		`{"name":"k","limit":100000,"window":"1h","algorithm":"fixed_window","on_response":{"statuses":[200,"4xx"],"cost_header":"X-Usage-Tokens"}}`,
		`{"name":"l","scope":"ip","limit":5,"window":"15m","on_response":{}}`,
		`{"name":"m","limit":100000,"window":"1h","on_response":{"statuses":["2xx"],"cost_body":"usage.total_tokens"}}`,
		`{"name":"n","limit":100,"window":"1h","cost":0,"on_response":{"cost_header":"x-cost"}}`,
		`{"name":"o","limit":100000,"window":"1mo","algorithm":"fixed_window"}`,
		`{"name":"p","scope":"tenant","limit":9000000,"window":"12mo","algorithm":"fixed_window","cost":0,"on_response":{"cost_header":"x-cost"}}`,
	} {
		want, err := rules.ParseRule([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		r := mustRule(t, body)
		doc, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := rules.ParseRule(doc)
		if err != nil {
			t.Fatalf("%s → %s: %v", body, doc, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s\n  → %s\n got %+v\nwant %+v", body, doc, got, want)
		}
	}
}

func TestStore_RulesAndAudit(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	s := open(t, url, time.Second)
	ctx := context.Background()
	r1 := mustRule(t, `{"name":"search","limit":5,"window":"1m","match":{"paths":["/search"]}}`)
	if _, had, v, err := s.PutRule(ctx, r1, who); err != nil || had || v != 1 {
		t.Fatalf("put: had=%v v=%d %v", had, v, err)
	}
	// The bridge that made the change serves it when it answers.
	snap := s.Snapshot()
	if snap.Version != 1 || len(snap.Rules) != 1 || snap.Rules[0].Name != "search" || snap.Rules[0].UpdatedBy != who.Who {
		t.Fatalf("snapshot after put: %+v", snap)
	}
	base, _ := rules.ParseConfig([]byte(`{}`))
	cfg, pv, err := base.WithPolicy(snap.Doc)
	if err != nil || pv != snap.PolicyVersion || len(cfg.Rules) != 1 || cfg.Rules[0].Spec.Limit != 5 {
		t.Fatalf("the plugin reads %s: %v %+v", snap.Doc, err, pv)
	}
	r2 := mustRule(t, `{"name":"search","limit":9,"window":"1m"}`)
	prev, had, v, err := s.PutRule(ctx, r2, who)
	if err != nil || !had || v != 2 || prev.Limit != 5 {
		t.Fatalf("replace: prev=%+v had=%v v=%d %v", prev, had, v, err)
	}
	if _, had, v, err := s.DeleteRule(ctx, "nope", who); err != nil || had || v != 0 {
		t.Fatalf("delete of nothing: had=%v v=%d %v", had, v, err)
	}
	if prev, had, v, err := s.DeleteRule(ctx, "search", who); err != nil || !had || v != 3 || prev.Limit != 9 {
		t.Fatalf("delete: prev=%+v had=%v v=%d %v", prev, had, v, err)
	}
	recs, err := s.Audit(ctx, AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d audit records, want 3 (the delete of nothing changed nothing)", len(recs))
	}
	want := []struct {
		action        string
		before, after bool
		version       int64
		limitBefore   string
	}{{ActionRuleDelete, true, false, 3, `"limit": 9`}, {ActionRulePut, true, true, 2, `"limit": 5`}, {ActionRulePut, false, true, 1, ""}}
	for i, w := range want {
		r := recs[i]
		if r.Action != w.action || (r.Before != nil) != w.before || (r.After != nil) != w.after || r.Version != w.version ||
			r.Who != who.Who || r.Remote != who.Remote || r.RequestID != who.RequestID || r.Target != "search" {
			t.Errorf("record %d: %+v", i, r)
		}
		if w.limitBefore != "" && !containsJSON(r.Before, w.limitBefore) {
			t.Errorf("record %d: before %s, want %s", i, r.Before, w.limitBefore)
		}
	}
	// Append-only.
	c := connect(t, url)
	for _, sql := range []string{"UPDATE sluice_audit SET who = 'x'", "DELETE FROM sluice_audit", "TRUNCATE sluice_audit"} {
		if _, err := c.Exec(ctx, sql); err == nil {
			t.Errorf("%s: allowed", sql)
		}
	}
}

func containsJSON(b []byte, s string) bool { return strings.Contains(string(b), s) }

func TestStore_AuditFiltersAndPages(t *testing.T) {
	s := open(t, pgtest.Shared(t).NewDatabase(t), time.Second)
	ctx := context.Background()
	set := overrides.New(s.Overrides(), nil)
	defer set.Close()
	<-set.Loaded()
	for i := 0; i < 5; i++ {
		c := who
		c.RequestID = fmt.Sprint("r", i)
		if i%2 == 1 {
			c.Who = "sha256:other"
		}
		o := overrides.Override{User: fmt.Sprint("u", i), Endpoint: "*", Algorithm: rules.FixedWindow, Limit: 3, WindowMS: 60000, UpdatedMS: 1}
		if _, _, err := set.Put(WithChange(ctx, c), o); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := s.PutRule(ctx, mustRule(t, `{"name":"x","limit":1,"window":"1m"}`), who); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		q    AuditQuery
		want []string // request ids
	}{
		{AuditQuery{Who: "sha256:other"}, []string{"r3", "r1"}},
		{AuditQuery{Action: ActionOverridePut, Limit: 2}, []string{"r4", "r3"}},
		{AuditQuery{Target: "u2 *"}, []string{"r2"}},
		{AuditQuery{RequestID: "r0"}, []string{"r0"}},
		{AuditQuery{Until: time.Now().Add(-time.Hour)}, nil},
		{AuditQuery{Since: time.Now().Add(-time.Hour), Action: ActionRulePut}, []string{"req-1"}},
	} {
		recs, err := s.Audit(ctx, tc.q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.RequestID)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.q, got, tc.want)
		}
	}
	// Pages: two at a time, newest first, every record once.
	var all []int64
	q := AuditQuery{Limit: 2}
	for {
		recs, err := s.Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			all = append(all, r.ID)
		}
		q.BeforeID = recs[len(recs)-1].ID
	}
	if len(all) != 6 || all[0] <= all[5] {
		t.Fatalf("pages gave ids %v", all)
	}
}

// Two bridges write at once: every acknowledged change is there once, with
// its own version and audit record, and both bridges end at the same
// policy.
func TestStore_ConcurrentWritersOnTwoBridges(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	a, b := open(t, url, time.Second), open(t, url, time.Second)
	ctx := context.Background()
	sets := []*overrides.Set{overrides.New(a.Overrides(), nil), overrides.New(b.Overrides(), nil)}
	for _, s := range sets {
		defer s.Close()
		<-s.Loaded()
	}
	const perBridge = 15
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[int64]bool{}
	for bi, st := range []*Store{a, b} {
		for i := 0; i < perBridge; i++ {
			wg.Go(func() {
				var v int64
				var err error
				if i%3 == 0 {
					_, _, v, err = st.PutRule(ctx, mustRule(t, fmt.Sprintf(`{"name":"r%d-%d","limit":%d,"window":"1m"}`, bi, i, i+1)), who)
				} else {
					o := overrides.Override{User: fmt.Sprintf("u%d-%d", bi, i), Endpoint: "/e", Algorithm: rules.SlidingWindow, Limit: int64(i + 1), WindowMS: 1000, UpdatedMS: 1}
					_, _, err = sets[bi].Put(WithChange(ctx, who), o)
					v = -1
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if v > 0 && versions[v] {
					t.Errorf("version %d twice", v)
				}
				versions[v] = true
			})
		}
	}
	wg.Wait()
	const total = 2 * perBridge
	c := connect(t, url)
	if n := count(t, c, "SELECT count(*) FROM sluice_audit"); n != total {
		t.Errorf("%d audit records, want %d", n, total)
	}
	if n := count(t, c, "SELECT count(DISTINCT version) FROM sluice_audit WHERE version BETWEEN 1 AND $1", total); n != total {
		t.Errorf("%d distinct versions in the audit, want %d", n, total)
	}
	for _, st := range []*Store{a, b} {
		waitVersion(t, st, total, 5*time.Second)
		snap := st.Snapshot()
		if len(snap.Rules) != 10 || len(snap.Overrides) != 20 {
			t.Errorf("snapshot %d: %d rules, %d overrides", snap.Version, len(snap.Rules), len(snap.Overrides))
		}
	}
	for bi, s := range sets {
		for i := 1; i < perBridge; i++ {
			if i%3 == 0 {
				continue
			}
			for _, other := range sets {
				deadline := time.Now().Add(5 * time.Second)
				for {
					if o, ok := other.Get(fmt.Sprintf("u%d-%d", bi, i), "/e"); ok && o.Limit == int64(i+1) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("override u%d-%d missing in a bridge", bi, i)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		}
		_ = s
	}
}

// NOTIFY carries a change to the other bridges: with the poll an hour
// away, the other bridge still learns it at once.
func TestStore_NotifyPropagation(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	a, b := open(t, url, time.Hour), open(t, url, time.Hour)
	for i := int64(1); i <= 3; i++ {
		if _, _, _, err := a.PutRule(context.Background(), mustRule(t, fmt.Sprintf(`{"name":"r%d","limit":1,"window":"1m"}`, i)), who); err != nil {
			t.Fatal(err)
		}
		took := waitVersion(t, b, i, 10*time.Second)
		t.Logf("version %d reached the other bridge in %v", i, took)
	}
}

// A change whose notification is lost (here: made without one) still
// arrives, by the version check every poll.
func TestStore_PollCatchesLostNotification(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	s := open(t, url, 50*time.Millisecond)
	c := connect(t, url)
	if _, err := c.Exec(context.Background(), `INSERT INTO sluice_rules (name, limit_count, window_ms, updated_by) VALUES ('quiet', 3, 1000, 'sql');
UPDATE sluice_policy SET version = version + 1`); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, s, 1, 10*time.Second)
	if r := s.Snapshot().Rules; len(r) != 1 || r[0].Name != "quiet" {
		t.Fatalf("rules %+v", r)
	}
}

func TestStore_TooManyRules(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	s := open(t, url, time.Second)
	ctx := context.Background()
	for i := 0; i < MaxRules; i++ {
		if _, _, _, err := s.PutRule(ctx, mustRule(t, fmt.Sprintf(`{"name":"r%d","limit":1,"window":"1m"}`, i)), who); err != nil {
			t.Fatal(i, err)
		}
	}
	if _, _, _, err := s.PutRule(ctx, mustRule(t, `{"name":"one-more","limit":1,"window":"1m"}`), who); !errors.Is(err, ErrTooManyRules) {
		t.Fatalf("rule %d: %v", MaxRules+1, err)
	}
	// Replacing one is still possible.
	if _, had, _, err := s.PutRule(ctx, mustRule(t, `{"name":"r0","limit":2,"window":"1m"}`), who); err != nil || !had {
		t.Fatalf("replacing: %v", err)
	}
	c := connect(t, url)
	if n := count(t, c, "SELECT count(*) FROM sluice_audit WHERE target = 'one-more'"); n != 0 {
		t.Fatalf("%d audit records of the refused rule", n)
	}
	if v := s.Snapshot().Version; v != MaxRules+1 {
		t.Fatalf("version %d, want %d (the refused rule made none)", v, MaxRules+1)
	}
}

// storedRule puts the rule object body into a new store and returns the
// rule the plugin reads back from the policy the store serves, and the
// rule the plugin reads from body itself.
func storedRule(t *testing.T, body string) (got, want rules.Rule) {
	t.Helper()
	s := open(t, pgtest.Shared(t).NewDatabase(t), time.Second)
	if _, _, _, err := s.PutRule(context.Background(), mustRule(t, body), who); err != nil {
		t.Fatal(err)
	}
	want, err := rules.ParseRule([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	base, _ := rules.ParseConfig([]byte(`{}`))
	cfg, _, err := base.WithPolicy(s.Snapshot().Doc)
	if err != nil || len(cfg.Rules) != 1 {
		t.Fatalf("the plugin reads %s: %v", s.Snapshot().Doc, err)
	}
	return cfg.Rules[0], want
}

// A throttle rule keeps its action and max_delay through the database:
// the plugin reads them back from the policy the store serves.
func TestStore_ThrottleRule(t *testing.T) {
	r, _ := storedRule(t, `{"name":"hooks","limit":50,"window":"1s","action":"throttle","max_delay":"4s"}`)
	if r.Action != rules.Throttle || r.MaxDelayMS != 4000 || r.Spec.Algorithm != rules.TokenBucket {
		t.Fatalf("rule %+v", r)
	}
}

// A rule's query conditions are stored (migration 0005) and the plugin
// reads them back from the policy the store serves, as they were put.
func TestStore_QueryRule(t *testing.T) {
	got, want := storedRule(t, `{"name":"csv","limit":10,"window":"1h","match":{"query":[{"name":"format","equals":"csv"},{"name":"page","present":false}]}}`)
	if !reflect.DeepEqual(got.Match, want.Match) {
		t.Errorf("match from the store %+v, want %+v", got.Match, want.Match)
	}
}

// A rule of calendar months keeps them (migration 0007) through the store
// to the plugin.
func TestStore_CalendarMonthsRule(t *testing.T) {
	got, want := storedRule(t, `{"name":"plan","limit":100000,"window":"3mo","algorithm":"fixed_window"}`)
	if got.Spec.Months != 3 || got.Spec != want.Spec {
		t.Errorf("spec from the store %+v, want %+v", got.Spec, want.Spec)
	}
}

// An override of calendar months keeps them (migration 0007) through the
// database to a bridge that loads it.
func TestStore_CalendarMonthsOverride(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	o := overrides.Override{User: "acme", Endpoint: "*", Algorithm: rules.FixedWindow, Limit: 2_000_000, WindowMS: rules.MonthMS, Months: 1, UpdatedMS: 1_767_225_600_000}
	a := overrides.New(open(t, url, time.Second).Overrides(), nil)
	defer a.Close()
	<-a.Loaded()
	if _, _, err := a.Put(WithChange(context.Background(), who), o); err != nil {
		t.Fatal(err)
	}
	b := overrides.New(open(t, url, time.Second).Overrides(), nil)
	defer b.Close()
	<-b.Loaded()
	if got, ok := b.Get("acme", "*"); !ok || got != o {
		t.Fatalf("loaded %+v %v, want %+v", got, ok, o)
	}
}

// A rule charged after the response keeps its on_response (migration
// 0006) through the store to the plugin.
func TestStore_OnResponseRule(t *testing.T) {
	got, want := storedRule(t, `{"name":"tokens","limit":100000,"window":"1h","cost":0,"on_response":{"statuses":["2xx"],"cost_header":"x-usage-tokens"}}`)
	if got.OnResponse == nil || !reflect.DeepEqual(*got.OnResponse, *want.OnResponse) {
		t.Errorf("on_response from the store %+v, want %+v", got.OnResponse, want.OnResponse)
	}
	if got.Spec.Cost != 0 {
		t.Errorf("cost from the store %d, want 0", got.Spec.Cost)
	}
}

// PostgreSQL killed: the last policy stays in force, writes fail as
// unavailable, the store reports it; restarted: everything acknowledged
// is there and the store follows again.
func TestStore_KilledAndRestarted(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewDatabase(t)
	s := open(t, url, 100*time.Millisecond)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if _, _, _, err := s.PutRule(ctx, mustRule(t, fmt.Sprintf(`{"name":"r%d","limit":1,"window":"1m"}`, i)), who); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for s.Status().State != "unreachable" {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v after the kill", s.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if snap := s.Snapshot(); snap.Version != 5 || len(snap.Rules) != 5 {
		t.Fatalf("the last policy is not in force: %+v", snap)
	}
	if _, _, _, err := s.PutRule(ctx, mustRule(t, `{"name":"lost","limit":1,"window":"1m"}`), who); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write while down: %v", err)
	}
	srv.Restart(t)
	deadline = time.Now().Add(20 * time.Second)
	for s.Status().State != "current" {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v after the restart", s.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, v, err := s.PutRule(ctx, mustRule(t, `{"name":"after","limit":1,"window":"1m"}`), who); err != nil || v != 6 {
		t.Fatalf("write after the restart: v=%d %v", v, err)
	}
	if snap := s.Snapshot(); len(snap.Rules) != 6 {
		t.Fatalf("%d rules after the restart, want 6", len(snap.Rules))
	}
}

// FuzzParseRule_RoundTrip: whatever rule the plugin accepts, the store's
// form written back (what the policy document serves) parses to the same
// rule, repeated and escaped fields included.
func FuzzParseRule_RoundTrip(f *testing.F) {
	for _, seed := range []string{
		`{"name":"a","limit":1,"window":"1m"}`,
		`{"name":"b","limit":600,"window":"1m30s","algorithm":"token_bucket","burst":50,"cost":2,"scope":"endpoint+user","action":"log_only","priority":-5,"enabled":false}`,
		`{"name":"c","limit":10,"window":"1h","match":{"paths":["/api/**","prefix:/x"],"methods":["get"],"hosts":["*.Example.com"],"headers":[{"name":"X-Key","present":false},{"name":"x","equals":"b","invert":true}]}}`,
		`{"name":"d","limit":10,"window":"1m","penalty":{"violation_threshold":5,"multipliers":[1,2],"violation\u005fthreshold":9}}`,
		`{"name":"e","limit":10,"limit":3,"window":"1m","penalty":{"enabled":false,"enabled":true}}`,
		`{"name":"f","limit":100,"window":"1s","lease":{"size":10,"ttl":"250ms","size":20}}`,
		`{"name":"g","limit":50,"window":"1s","action":"throttle","max_delay":"2500ms","burst":5}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, err := rules.ParseRule(body)
		if err != nil {
			return
		}
		r, err := ParseRule(body)
		if err != nil {
			t.Fatalf("rules.ParseRule accepts %s, ParseRule: %v", body, err)
		}
		doc, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := rules.ParseRule(doc)
		if err != nil {
			t.Fatalf("%s → %s: %v", body, doc, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s\n  → %s\n got %+v\nwant %+v", body, doc, got, want)
		}
	})
}

// A bridge that starts while PostgreSQL is down has no policy: it says
// so, and reads it once PostgreSQL is up.
func TestStore_StartsWhilePostgresIsDown(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.NewDatabase(t)
	srv.Kill()
	s, err := Open(Options{URL: url, Retry: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.Status().Error == "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := s.Status(); st.State != "loading" || st.Error == "" || s.Snapshot() != nil {
		t.Fatalf("status %+v, snapshot %v", st, s.Snapshot())
	}
	srv.Restart(t)
	select {
	case <-s.Loaded():
	case <-time.After(20 * time.Second):
		t.Fatalf("not loaded after the restart: %+v", s.Status())
	}
	if st := s.Status(); st.State != "current" || st.Error != "" {
		t.Fatalf("status %+v", st)
	}
}

// A bridge takes writes and audit reads before its schema is migrated
// (it has just started, or another bridge's migration holds the lock):
// they wait for the migration instead of failing on missing tables, and
// answer 503 only if their deadline passes first.
func TestStore_WaitsForTheSchema(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	lock := connect(t, url)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{}, 3)
	s, err := Open(Options{URL: url, Retry: 50 * time.Millisecond, onWait: func() { waiting <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Audit(short, AuditQuery{}); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "schema is not migrated yet") {
		t.Fatalf("audit past its deadline while the schema is locked: %v", err)
	}
	<-waiting

	type result struct {
		version int64
		recs    []AuditRecord
		err     error
	}
	put, audit := make(chan result, 1), make(chan result, 1)
	r := mustRule(t, `{"name":"a","limit":1,"window":"1m"}`)
	go func() {
		_, _, v, err := s.PutRule(ctx, r, who)
		put <- result{version: v, err: err}
	}()
	go func() {
		recs, err := s.Audit(ctx, AuditQuery{})
		audit <- result{recs: recs, err: err}
	}()
	for range 2 {
		select {
		case <-waiting:
		case res := <-put:
			t.Fatalf("PutRule answered before the schema was migrated: version %d, %v", res.version, res.err)
		case res := <-audit:
			t.Fatalf("Audit answered before the schema was migrated: %d records, %v", len(res.recs), res.err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res := <-put; res.err != nil || res.version != 1 {
		t.Fatalf("PutRule after the migration: version %d, %v", res.version, res.err)
	}
	if res := <-audit; res.err != nil || len(res.recs) > 1 {
		t.Fatalf("Audit after the migration: %d records, %v", len(res.recs), res.err)
	}
	if snap := s.Snapshot(); snap == nil || snap.Version != 1 || len(snap.Rules) != 1 || snap.Rules[0].Name != "a" {
		t.Fatalf("snapshot after the write: %+v", snap)
	}
}
