package redisbridge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/redisbridge/pgtest"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var adminHdr = []string{"Authorization", "Bearer admin-secret"}

// startPolicyBridge runs a bridge with the policy store at url and waits
// until it has read the policy.
func startPolicyBridge(t *testing.T, set Settings, url string) *testServer {
	t.Helper()
	set.PolicyStore = url
	ts := startServer(t, set)
	select {
	case <-ts.policy.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatalf("policy not read: %+v", ts.policy.Status())
	}
	return ts
}

func pgCount(t *testing.T, url, sql string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A rule the plugin would refuse is refused by the rules API with the
// same field path and reason, and leaves no row and no audit record.
func TestPolicy_RuleRefusedAsThePluginWould(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	ts := startPolicyBridge(t, testSettings(), url)
	for _, rule := range []string{
		`{"name":"bad","limit":0,"window":"1m"}`,
		`{"name":"bad","limit":1,"window":"400d"}`,
		`{"name":"bad","limit":10,"window":"1m","burst":20}`,
		`{"name":"bad","limit":1,"window":"1m","cost":2}`,
		`{"name":"bad","limit":1,"window":"1m","scope":"global+ip"}`,
		`{"name":"bad","limit":10,"window":"1m","match":{"paths":["api/v1"]}}`,
		`{"name":"bad","limit":10,"window":"1m","match":{"headers":[{"name":"x"}]}}`,
		`{"name":"bad","limit":10,"window":"1m","penalty":{"multipliers":[4,2]}}`,
		`{"name":"bad","limit":10,"window":"1m","strategy":"fixed_window"}`,
	} {
		_, perr := rules.ParseConfig([]byte(`{"rules":[` + rule + `]}`))
		ce, ok := perr.(*rules.ConfigError)
		if !ok {
			t.Fatalf("%s: the plugin accepts it (%v)", rule, perr)
		}
		r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/rules/bad", rule, adminHdr...)
		if r.status != 400 || r.errCode(t) != codeInvalidInput {
			t.Fatalf("%s: %d %s", rule, r.status, r.body)
		}
		d := r.json(t)["error"].(map[string]any)["details"].(map[string]any)
		if "rules[0]."+d["field"].(string) != ce.Path || d["reason"] != ce.Err.Error() {
			t.Errorf("%s:\n bridge %v: %v\n plugin %s: %v", rule, d["field"], d["reason"], ce.Path, ce.Err)
		}
	}
	if n := pgCount(t, url, "SELECT count(*) FROM sluice_rules"); n != 0 {
		t.Errorf("%d rules stored", n)
	}
	if n := pgCount(t, url, "SELECT count(*) FROM sluice_audit"); n != 0 {
		t.Errorf("%d audit records", n)
	}
	if v := ts.policy.Snapshot().Version; v != 0 {
		t.Errorf("policy version %d, want 0", v)
	}
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/rules/other", `{"name":"bad","limit":1,"window":"1m"}`, adminHdr...); r.status != 400 || !strings.Contains(string(r.body), `"field":"name"`) {
		t.Errorf("name other than the path's: %d %s", r.status, r.body)
	}
}

func TestPolicy_RulesAPIAndPolicyDocument(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	set := testSettings()
	set.CheckToken = "check-token"
	ts := startPolicyBridge(t, set, url)
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/rules/search", `{"name":"search","limit":5,"window":"1m"}`); r.status != 401 {
		t.Fatalf("without the admin key: %d", r.status)
	}
	r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/rules/search", `{"name":"search","match":{"paths":["/search"]},"limit":5,"window":"1m","algorithm":"fixed_window"}`, adminHdr...)
	if r.status != 200 || r.json(t)["version"] != 1.0 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	r = do(t, nil, "GET", ts.URL+"/v1/rate-limit/rules/search", "", adminHdr...)
	if r.status != 200 || !strings.Contains(string(r.body), `"rule":{"name":"search","match":{"paths":["/search"]}`) || !strings.Contains(string(r.body), `"updated_by":"sha256:`) {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/rules", "", adminHdr...); r.status != 200 || len(r.json(t)["rules"].([]any)) != 1 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}

	// The policy document: the check token, an ETag, 304 when unchanged,
	// and what the plugin reads.
	if r := do(t, nil, "GET", ts.URL+rules.PolicyPath, ""); r.status != 401 {
		t.Fatalf("policy without the check token: %d", r.status)
	}
	r = do(t, nil, "GET", ts.URL+rules.PolicyPath, "", "Authorization", "Bearer check-token")
	etag := r.header.Get("Etag")
	if r.status != 200 || etag != ts.policy.Snapshot().ETag() {
		t.Fatalf("policy: %d %s etag %q", r.status, r.body, etag)
	}
	base, _ := rules.ParseConfig([]byte(`{}`))
	cfg, v, err := base.WithPolicy(r.body)
	if err != nil || v.Version != 1 || cfg.Rules[0].Spec.Algorithm != rules.FixedWindow {
		t.Fatalf("the plugin reads %s: %v", r.body, err)
	}
	if r := do(t, nil, "GET", ts.URL+rules.PolicyPath, "", "Authorization", "Bearer check-token", "If-None-Match", etag); r.status != 304 || len(r.body) != 0 {
		t.Fatalf("unchanged: %d %s", r.status, r.body)
	}

	r = do(t, nil, "DELETE", ts.URL+"/v1/rate-limit/rules/search", "", adminHdr...)
	if r.status != 200 || r.json(t)["version"] != 2.0 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "DELETE", ts.URL+"/v1/rate-limit/rules/search", "", adminHdr...); r.status != 404 {
		t.Fatalf("delete again: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+rules.PolicyPath, "", "Authorization", "Bearer check-token", "If-None-Match", etag); r.status != 200 || !strings.Contains(string(r.body), `"rules":[]`) {
		t.Fatalf("after the delete: %d %s", r.status, r.body)
	}

	// The audit trail through the API: newest first, filtered, paged.
	r = do(t, nil, "GET", ts.URL+"/v1/rate-limit/audit?target=search&limit=1", "", adminHdr...)
	var page struct {
		Records []struct {
			ID      int64
			Action  string
			Version int64
			Before  json.RawMessage
			After   json.RawMessage
			Remote  string `json:"remote"`
			ReqID   string `json:"request_id"`
		}
		Next int64 `json:"next_before_id"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil || r.status != 200 || len(page.Records) != 1 || page.Records[0].Action != "rule.delete" ||
		string(page.Records[0].After) != "null" || page.Next != page.Records[0].ID || page.Records[0].Remote == "" || page.Records[0].ReqID == "" {
		t.Fatalf("audit page 1: %d %s", r.status, r.body)
	}
	r = do(t, nil, "GET", ts.URL+fmt.Sprintf("/v1/rate-limit/audit?target=search&limit=1&before_id=%d", page.Next), "", adminHdr...)
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Records) != 1 || page.Records[0].Action != "rule.put" || page.Records[0].Version != 1 {
		t.Fatalf("audit page 2: %d %s", r.status, r.body)
	}
	for _, q := range []string{"?zz=1", "?limit=0", "?since=yesterday", "?who=a&who=b"} {
		if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/audit"+q, "", adminHdr...); r.status != 400 {
			t.Errorf("audit%s: %d %s", q, r.status, r.body)
		}
	}
}

// Overrides are kept in PostgreSQL with their audit records, applied to
// checks, and deleted.
func TestPolicy_Overrides(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	ts := startPolicyBridge(t, testSettings(), url)
	cfg := `{"user_id":"alice","endpoint":"/api","limit":2,"window_seconds":60,"algorithm":"fixed_window"}`
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", cfg, adminHdr...); r.status != 200 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	if n := pgCount(t, url, "SELECT count(*) FROM sluice_overrides WHERE user_id = 'alice' AND limit_count = 2"); n != 1 {
		t.Fatalf("%d rows", n)
	}
	check := `{"user_id":"alice","endpoint":"/api","limit":100}`
	for i, want := range []int{200, 200, 429} {
		if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check); r.status != want {
			t.Fatalf("check %d: %d %s", i, r.status, r.body)
		}
	}
	if r := do(t, nil, "DELETE", ts.URL+"/v1/rate-limit/config/alice/api", "", adminHdr...); r.status != 200 || r.json(t)["limit"] != 2.0 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/config/alice/api", "", adminHdr...); r.status != 404 {
		t.Fatalf("get after delete: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "DELETE", ts.URL+"/v1/rate-limit/config/alice/api", "", adminHdr...); r.status != 404 {
		t.Fatalf("delete again: %d %s", r.status, r.body)
	}
	if n := pgCount(t, url, "SELECT count(*) FROM sluice_audit WHERE target = 'alice /api'"); n != 2 {
		t.Fatalf("%d audit records, want put and delete", n)
	}
}

// Without --policy-store the rules, policy and audit endpoints do not
// exist; deleting an override works on every backend.
func TestPolicy_WithoutStore(t *testing.T) {
	ts := startServer(t, testSettings())
	for _, path := range []string{"/v1/rate-limit/rules", "/v1/rate-limit/audit", rules.PolicyPath} {
		if r := do(t, nil, "GET", ts.URL+path, "", adminHdr...); r.status != 404 || !strings.Contains(string(r.body), "--policy-store") {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
	do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", `{"user_id":"bob","endpoint":"*","limit":2,"window_seconds":60,"algorithm":"fixed_window"}`, adminHdr...)
	if r := do(t, nil, "DELETE", ts.URL+"/v1/rate-limit/config/bob/*", "", adminHdr...); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if _, ok := ts.overrides.Get("bob", "*"); ok {
		t.Fatal("still there")
	}
}

// Two bridges on one policy store take changes at once: each is
// acknowledged with a version of its own, audited once, and both bridges
// end with every change.
func TestPolicy_ConcurrentWritersOnTwoBridges(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	bridges := []*testServer{startPolicyBridge(t, testSettings(), url), startPolicyBridge(t, testSettings(), url)}
	const writers, each = 3, 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[float64]bool{}
	for bi, br := range bridges {
		for w := 0; w < writers; w++ {
			wg.Go(func() {
				for i := 0; i < each; i++ {
					var r reply
					if i%2 == 0 {
						name := fmt.Sprintf("r-%d-%d-%d", bi, w, i)
						r = do(t, nil, "PUT", br.URL+"/v1/rate-limit/rules/"+name, `{"name":"`+name+`","limit":3,"window":"1m"}`, adminHdr...)
					} else {
						r = do(t, nil, "PUT", br.URL+"/v1/rate-limit/config", fmt.Sprintf(`{"user_id":"u-%d-%d-%d","endpoint":"*","limit":3,"window_seconds":60,"algorithm":"fixed_window"}`, bi, w, i), adminHdr...)
					}
					if r.status != 200 {
						t.Errorf("bridge %d: %d %s", bi, r.status, r.body)
						continue
					}
					if v, ok := r.json(t)["version"].(float64); ok {
						mu.Lock()
						if versions[v] {
							t.Errorf("version %v acknowledged twice", v)
						}
						versions[v] = true
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	const total = 2 * writers * each
	if n := pgCount(t, url, "SELECT count(DISTINCT version) FROM sluice_audit"); n != total {
		t.Errorf("%d audited versions, want %d", n, total)
	}
	for bi, br := range bridges {
		deadline := time.Now().Add(5 * time.Second)
		for br.policy.Snapshot().Version < total && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		r := do(t, nil, "GET", br.URL+"/v1/rate-limit/rules", "", adminHdr...)
		if got := len(r.json(t)["rules"].([]any)); got != total/2 {
			t.Errorf("bridge %d lists %d rules, want %d", bi, got, total/2)
		}
		for deadline := time.Now().Add(5 * time.Second); len(br.overrides.All()) < total/2 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := len(br.overrides.All()); got != total/2 {
			t.Errorf("bridge %d applies %d overrides, want %d", bi, got, total/2)
		}
	}
}

// An acknowledged override survives a Redis restart (Redis holds only
// counters now) and a bridge restart.
func TestPolicy_SurvivesRedisAndBridgeRestart(t *testing.T) {
	url := pgtest.Shared(t).NewDatabase(t)
	red := redistest.Start(t)
	set := testSettings()
	set.Store, set.RedisURL, set.Now = "redis", red.URL, nil
	a := startPolicyBridge(t, set, url)
	cfg := `{"user_id":"carol","endpoint":"*","limit":1,"window_seconds":3600,"algorithm":"fixed_window"}`
	if r := do(t, nil, "PUT", a.URL+"/v1/rate-limit/config", cfg, adminHdr...); r.status != 200 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	red.Restart()
	_ = a.Shutdown(context.Background())
	b := startPolicyBridge(t, set, url)
	<-b.overrides.Loaded()
	check := `{"user_id":"carol","endpoint":"/x","limit":100,"window_seconds":3600,"algorithm":"fixed_window"}`
	if r := do(t, nil, "POST", b.URL+"/v1/rate-limit/check", check); r.status != 200 || r.json(t)["limit"] != 1.0 {
		t.Fatalf("first check on the new bridge: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "POST", b.URL+"/v1/rate-limit/check", check); r.status != 429 {
		t.Fatalf("second check: %d %s", r.status, r.body)
	}
}

// PostgreSQL killed and restarted while checks and changes keep coming:
// no check fails (the overrides in force stay in force), /readyz stays
// ready with the policy store's state in its detail, changes fail with
// 503 while it is down, and every change that was acknowledged is there
// afterwards, in the database and in the bridge.
func TestPolicy_PostgresKilledUnderLoad(t *testing.T) { postgresKilledUnderLoad(t, 1) }

// postgresKilledUnderLoad kills and restarts PostgreSQL cycles times
// under checks and changes.
func postgresKilledUnderLoad(t *testing.T, cycles int) {
	srv := pgtest.Start(t)
	url := srv.NewDatabase(t)
	set := testSettings()
	var logs syncbuf.Buffer
	set.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ts := startPolicyBridge(t, set, url)
	base := `{"user_id":"dave","endpoint":"*","limit":1000000,"window_seconds":60,"algorithm":"sliding_window"}`
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", base, adminHdr...); r.status != 200 {
		t.Fatal(r.status)
	}
	stop := make(chan struct{})
	var checks, badChecks atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Go(func() {
			for n := 0; n < 100_000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", `{"user_id":"dave","endpoint":"/x"}`)
				checks.Add(1)
				if r.status != 200 || !strings.Contains(string(r.body), `"limit":1000000`) {
					badChecks.Add(1)
				}
			}
		})
	}
	var mu sync.Mutex
	acked := map[string]bool{}
	var refused atomic.Int64
	writer := func(from, to int) {
		for i := from; i < to; i++ {
			user := fmt.Sprint("w", i)
			r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", `{"user_id":"`+user+`","endpoint":"*","limit":5,"window_seconds":60,"algorithm":"fixed_window"}`, adminHdr...)
			switch r.status {
			case 200:
				mu.Lock()
				acked[user] = true
				mu.Unlock()
			case 503:
				refused.Add(1)
			default:
				t.Errorf("put %s: %d %s", user, r.status, r.body)
			}
		}
	}
	next := 0
	for c := 0; c < cycles; c++ {
		writer(next, next+20)
		srv.Kill()
		deadline := time.Now().Add(10 * time.Second)
		for ts.policy.Status().State != "unreachable" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		r := do(t, nil, "GET", ts.URL+"/readyz", "")
		if r.status != 200 || !strings.Contains(string(r.body), `"state":"unreachable"`) {
			t.Errorf("readyz while PostgreSQL is down: %d %s", r.status, r.body)
		}
		if m := do(t, nil, "GET", ts.URL+"/metrics", ""); !strings.Contains(string(m.body), "sluice_bridge_policy_store_up 0") {
			t.Errorf("metrics while down: %s", grep(m.body, "sluice_bridge_policy"))
		}
		before := refused.Load()
		writer(next+20, next+30)
		if refused.Load() == before {
			t.Error("no change refused while PostgreSQL was down")
		}
		if c == 0 {
			// Rule changes and audit reads answer 503 too, and the log
			// says what the store's error was.
			for _, call := range []struct{ method, path, body, action string }{
				{"PUT", "/v1/rate-limit/rules/down", `{"name":"down","limit":1,"window":"1m"}`, "rule.put"},
				{"DELETE", "/v1/rate-limit/rules/down", "", "rule.delete"},
				{"GET", "/v1/rate-limit/audit", "", "audit.get"},
			} {
				if r := do(t, nil, call.method, ts.URL+call.path, call.body, adminHdr...); r.status != 503 {
					t.Errorf("%s %s while PostgreSQL is down: %d %s", call.method, call.path, r.status, r.body)
				}
				if line := grep([]byte(logs.String()), "action="+call.action+" "); !strings.Contains(line, "msg=policy_store_error") || !strings.Contains(line, "err=") {
					t.Errorf("%s: no policy_store_error logged: %q", call.action, line)
				}
			}
		}
		srv.Restart(t)
		deadline = time.Now().Add(20 * time.Second)
		for ts.policy.Status().State != "current" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		next += 30
	}
	writer(next, next+10)
	close(stop)
	wg.Wait()
	if checks.Load() == 0 || badChecks.Load() != 0 {
		t.Errorf("%d of %d checks failed or lost the override", badChecks.Load(), checks.Load())
	}
	for user := range acked {
		if n := pgCount(t, url, "SELECT count(*) FROM sluice_overrides WHERE user_id = $1", user); n != 1 {
			t.Errorf("acknowledged override of %s lost", user)
		}
		if _, ok := ts.overrides.Get(user, "*"); !ok {
			t.Errorf("acknowledged override of %s not in force", user)
		}
	}
	if len(acked) < 20*cycles+10 {
		t.Errorf("only %d changes acknowledged", len(acked))
	}
	t.Logf("%d checks, %d changes acknowledged, %d refused while down", checks.Load(), len(acked), refused.Load())
}
