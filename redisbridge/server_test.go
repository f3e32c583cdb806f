package redisbridge

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/syncbuf"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// testServer runs a bridge on a loopback listener.
type testServer struct {
	*Server
	URL string
}

func startServer(t testing.TB, set Settings) *testServer {
	t.Helper()
	return startServerWith(t, set, nil)
}

// startServerWith runs a bridge after tweak changed it.
func startServerWith(t testing.TB, set Settings, tweak func(*Server)) *testServer {
	t.Helper()
	if set.Logger == nil {
		set.Logger = discardLogger()
	}
	if set.AuditLog == "" {
		set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	}
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		_ = s.Shutdown(context.Background())
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		s.Close()
	})
	return &testServer{Server: s, URL: "http://" + ln.Addr().String()}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testSettings are a memory store on a clock that stands still (see
// fakeClock to move it), so no answer depends on when the test runs.
func testSettings() Settings {
	s := DefaultSettings()
	s.AdminKey = "admin-secret"
	fakeClock(&s)
	return s
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return v
}

func (r reply) errCode(t *testing.T) string {
	t.Helper()
	e, _ := r.json(t)["error"].(map[string]any)
	if e == nil || e["request_id"] == "" || e["message"] == "" {
		t.Fatalf("not an error envelope: %s", r.body)
	}
	code, _ := e["code"].(string)
	return code
}

func do(t *testing.T, c *http.Client, method, url, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

func checkBody(limits ...rules.LimitRequest) string {
	return string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{RequestID: "r1", Limits: limits}))
}

// limit is a limit of n per year. Bridges on the memory store run on a
// clock that stands still; those on Redis take Redis TIME, and a window
// of a year keeps a fixed window from ending between two checks of a test.
func limit(key string, alg rules.Algorithm, n int64) rules.LimitRequest {
	return rules.LimitRequest{Key: key, Rule: "rule1", Spec: rules.LimitSpec{Algorithm: alg, Limit: n, WindowMS: rules.MaxWindowMS, Burst: n, Cost: 1}}
}

// h2cClient is an HTTP/2 client without TLS. Its connections are closed
// when t ends, before the bridge shuts down: a bridge shutting down waits
// up to a second for h2 clients to close theirs.
func h2cClient(t testing.TB) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestServer_CheckHTTP1AndH2C(t *testing.T) {
	ts := startServer(t, testSettings())
	for _, tc := range []struct {
		name   string
		client *http.Client
		proto  int
	}{{"http1", http.DefaultClient, 1}, {"h2c", h2cClient(t), 2}} {
		t.Run(tc.name, func(t *testing.T) {
			body := checkBody(limit("rl:{u:"+tc.name+"}:a", rules.FixedWindow, 2), limit("rl:{u:"+tc.name+"}:b", rules.TokenBucket, 5))
			req, _ := http.NewRequest("POST", ts.URL+"/v1/rate-limit/check", strings.NewReader(body))
			resp, err := tc.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.ProtoMajor != tc.proto || resp.StatusCode != 200 {
				t.Fatalf("proto %s status %d: %s", resp.Proto, resp.StatusCode, b)
			}
			var cr rules.CheckResponse
			if err := rules.DecodeCheckResponse(b, 2, &cr); err != nil || !cr.Allowed || cr.Decisions[0].Remaining != 1 {
				t.Fatalf("%+v %v", cr, err)
			}
			// Headers describe the most restrictive decision: the fixed window.
			if resp.Header.Get("X-RateLimit-Limit") != "2" || resp.Header.Get("X-RateLimit-Remaining") != "1" ||
				resp.Header.Get("X-RateLimit-Strategy") != "fixed_window" || resp.Header.Get("X-RateLimit-Reset") == "" {
				t.Fatalf("headers %v", resp.Header)
			}
			do(t, tc.client, "POST", ts.URL+"/v1/rate-limit/check", body)
			r := do(t, tc.client, "POST", ts.URL+"/v1/rate-limit/check", body)
			if err := rules.DecodeCheckResponse(r.body, 2, &cr); err != nil || r.status != 200 || cr.Allowed || cr.Decisions[0].RetryAfterMS <= 0 {
				t.Fatalf("third: %d %s", r.status, r.body)
			}
		})
	}
}

func TestServer_CheckErrors(t *testing.T) {
	ts := startServer(t, testSettings())
	for _, tc := range []struct {
		name, body string
		status     int
		code, msg  string
	}{
		{"not json", "{", 400, codeInvalidInput, "not valid JSON"},
		{"bad field", `{"limits":[{"key":"k","algorithm":"token_bucket","limit":0,"window_ms":1}]}`, 400, codeInvalidInput, "limits[0].limit"},
		{"bad algorithm", `{"limits":[{"key":"k","algorithm":"leaky","limit":1,"window_ms":1}]}`, 400, codeInvalidInput, "limits[0].algorithm"},
		{"too large", `{"limits":[],"pad":"` + strings.Repeat("x", maxBody) + `"}`, 413, codeTooLarge, "65536"},
		{"REST bad algorithm", `{"user_id":"u","endpoint":"/e","algorithm":"leaky"}`, 400, codeInvalidAlgorithm, "algorithm"},
		{"REST algorithm by its former name", `{"user_id":"u","endpoint":"/e","strategy":"token_bucket"}`, 400, codeInvalidInput, "strategy: renamed: use algorithm"},
		{"REST unknown field", `{"user_id":"u","endpoint":"/e","limt":3}`, 400, codeInvalidInput, "limt: unknown field"},
		{"REST field twice", `{"user_id":"u","endpoint":"/e","limit":3,"limit":5}`, 400, codeInvalidInput, `"field":"limit","reason":"given twice"`},
		{"REST bad limit", `{"user_id":"u","endpoint":"/e","limit":0}`, 400, codeInvalidLimit, "limit"},
		{"REST no endpoint", `{"user_id":"u"}`, 400, codeInvalidInput, "endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", tc.body, "X-Request-Id", "abc")
			if r.status != tc.status || r.errCode(t) != tc.code || !strings.Contains(string(r.body), tc.msg) {
				t.Fatalf("%d %s, want %d %s mentioning %q", r.status, r.body, tc.status, tc.code, tc.msg)
			}
			if !strings.Contains(string(r.body), `"request_id":"abc"`) {
				t.Fatalf("request id not echoed: %s", r.body)
			}
		})
	}
	// The batch names the field with its path.
	batch := `{"checks":[{"user_id":"u","endpoint":"/e"},{"user_id":"u","endpoint":"/e","user_id":"v"}]}`
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", batch); r.status != 400 ||
		!strings.Contains(string(r.body), `"field":"checks[1].user_id","reason":"given twice"`) {
		t.Fatalf("a batch check's field twice: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/nope", ""); r.status != 404 || r.errCode(t) != codeNotFound {
		t.Fatalf("unknown path: %d %s", r.status, r.body)
	}
}

func TestServer_RESTCheckAndStatus(t *testing.T) {
	set := testSettings()
	set.DefaultLimit, set.DefaultAlgorithm = 2, "fixed_window"
	ts := startServer(t, set)
	body := `{"user_id":"user_123","endpoint":"/api/v1/users"}`
	for i, want := range []int{200, 200, 429} {
		r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body)
		if r.status != want {
			t.Fatalf("check %d: %d %s", i, r.status, r.body)
		}
		if want == 429 && (r.header.Get("Retry-After") == "" || r.json(t)["allowed"] != false) {
			t.Fatalf("429 without Retry-After or allowed=false: %v %s", r.header, r.body)
		}
	}
	r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/user_123/api/v1/users", "")
	v := r.json(t)
	if r.status != 200 || v["remaining"] != 0.0 || v["usage_percentage"] != 100.0 || v["endpoint"] != "/api/v1/users" || v["algorithm"] != "fixed_window" {
		t.Fatalf("status: %d %s", r.status, r.body)
	}
	for q, code := range map[string]string{
		"algorithm=leaky": codeInvalidAlgorithm, "strategy=fixed_window": codeInvalidInput, "limit=x": codeInvalidLimit,
		"limit=0": codeInvalidLimit, "cost=1": codeInvalidInput, "limit=1&limit=2": codeInvalidInput,
	} {
		if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/user_9/x?"+q, ""); r.status != 400 || r.errCode(t) != code {
			t.Errorf("?%s: %d %s, want 400 %s", q, r.status, r.body, code)
		}
	}
}

func TestServer_BatchIdempotent(t *testing.T) {
	ts := startServer(t, testSettings())
	body := `{"idempotency_key":"batch_1","checks":[{"user_id":"a","endpoint":"/x","limit":1},{"user_id":"b","endpoint":"/y","limit":1,"algorithm":"token_bucket"},{"user_id":"a","endpoint":"/x","limit":1}]}`
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", body)
	var out struct {
		Results []restResult `json:"results"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || r.status != 200 || len(out.Results) != 3 {
		t.Fatalf("%d %s %v", r.status, r.body, err)
	}
	allowedA := 0
	for _, res := range out.Results {
		if res.UserID == "a" && res.Allowed {
			allowedA++
		}
	}
	if allowedA != 1 || !out.Results[1].Allowed || out.Results[1].Algorithm != "token_bucket" {
		t.Fatalf("results %+v: want one of a's two checks allowed, b allowed", out.Results)
	}
	again := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", body)
	if !bytes.Equal(again.body, r.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay differs: %s vs %s", again.body, r.body)
	}
	if m := do(t, nil, "GET", ts.URL+"/metrics", "").body; !bytes.Contains(m, []byte("sluice_bridge_idempotent_replays_total 1\n")) {
		t.Fatalf("replay not counted:\n%s", grep(m, "idempotent"))
	}
	// Without the key the same checks run again and are now denied.
	fresh := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", strings.Replace(body, `"idempotency_key":"batch_1",`, "", 1))
	if bytes.Contains(fresh.body, []byte(`"allowed":true`)) {
		t.Fatalf("fresh batch should be denied: %s", fresh.body)
	}
	for _, bad := range []string{`{"checks":[]}`, `{"checks":[{"user_id":"a"}]}`, `{"checks":[{"user_id":"a","endpoint":"/x","window_seconds":0}]}`, `[]`} {
		if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", bad); r.status != 400 {
			t.Fatalf("%s: %d %s", bad, r.status, r.body)
		}
	}
}

// An override may give a user a quota of calendar months: the API keeps
// window_months, and the user's per-user limits then end on the 1st; a
// throttle limit so overridden refuses rather than holds.
func TestServer_OverrideOfCalendarMonths(t *testing.T) {
	ts := startServer(t, testSettings()) // 2026-01-01T00:00:00.123Z
	for _, body := range []string{
		`{"user_id":"acme","endpoint":"*","limit":2,"window_seconds":60,"window_months":1,"algorithm":"fixed_window"}`,
		`{"user_id":"acme","endpoint":"*","limit":2,"window_months":5,"algorithm":"fixed_window"}`,
		`{"user_id":"acme","endpoint":"*","limit":2,"window_months":1,"algorithm":"token_bucket"}`,
	} {
		if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", body, adminHdr...); r.status != 400 || r.errCode(t) != codeInvalidLimit {
			t.Fatalf("%s: %d %s", body, r.status, r.body)
		}
	}
	r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", `{"user_id":"acme","endpoint":"*","limit":2,"window_months":1,"algorithm":"fixed_window"}`, adminHdr...)
	if r.status != 200 || r.json(t)["window_months"] != 1.0 || r.json(t)["window_seconds"] != nil {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	pl := limit("rl:{u:acme}:api", rules.TokenBucket, 100)
	pl.PerUser, pl.Throttle, pl.MaxDelayMS = true, true, 30_000
	wire := string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{User: "acme", Endpoint: "/v1/x", Limits: []rules.LimitRequest{pl}}))
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i, allowed := range []bool{true, true, false} {
		var cr rules.CheckResponse
		r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", wire)
		if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil {
			t.Fatalf("check %d: %v %s", i, err, r.body)
		}
		if d := cr.Decisions[0]; cr.Allowed != allowed || cr.DelayMS != 0 || d.Limit != 2 || d.ResetMS != feb {
			t.Fatalf("check %d: %+v, want allowed %v, not held, reset on February 1", i, cr, allowed)
		}
	}
	// Nor is a leased limit so overridden leased.
	leased := limit("rl:{u:acme}:hot", rules.FixedWindow, 100)
	leased.PerUser, leased.Spec.Lease = true, rules.Lease{Size: 10, TTLMS: 1000}
	var cr rules.CheckResponse
	r = do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{User: "acme", Endpoint: "/v1/x", Limits: []rules.LimitRequest{leased}})))
	if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || !cr.Allowed || cr.Decisions[0].Lease.Units != 0 || cr.Decisions[0].ResetMS != feb {
		t.Fatalf("leased limit of calendar months: %+v %v", cr, err)
	}
}

// A REST check may count calendar months (window_months, fixed_window):
// it, a batch and status end its window on the 1st, apart from a counter
// of seconds of the same user and endpoint; a bad window names its field.
func TestServer_RESTCheckOfCalendarMonths(t *testing.T) {
	set := testSettings()
	now := fakeClock(&set) // 2026-01-01T00:00:00.123Z
	ts := startServer(t, set)
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","algorithm":"fixed_window","window_seconds":60,"window_months":1}`, "window_months"},
		{"POST", "/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","algorithm":"fixed_window","window_months":5}`, "window_months"},
		{"POST", "/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","algorithm":"token_bucket","window_months":1}`, "window_months"},
		{"POST", "/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","window_months":1}`, "window_months"}, // the default algorithm slides
		{"POST", "/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","window_seconds":0}`, "window_seconds"},
		{"POST", "/v1/rate-limit/batch-check", `{"checks":[{"user_id":"acme","endpoint":"/e","algorithm":"fixed_window","window_months":7}]}`, "checks[0].window_months"},
		{"GET", "/v1/rate-limit/status/acme/e?algorithm=fixed_window&window_months=0", "", "window_months"},
	} {
		r := do(t, nil, tc.method, ts.URL+tc.path, tc.body)
		if r.status != 400 || r.errCode(t) != codeInvalidLimit || !strings.Contains(string(r.body), `"field":"`+tc.field+`"`) {
			t.Errorf("%s %s: %d %s, want 400 naming %s", tc.path, tc.body, r.status, r.body, tc.field)
		}
	}
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	check := `{"user_id":"acme","endpoint":"/e","algorithm":"fixed_window","limit":2,"window_months":1}`
	for i, want := range []int{200, 200, 429} {
		r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check)
		if r.status != want || r.json(t)["reset_at"] != float64(feb.Unix()) {
			t.Fatalf("check %d: %d %s, want %d resetting on February 1", i, r.status, r.body, want)
		}
		if want == 429 && (r.json(t)["retry_after"] != float64(31*24*3600) || r.header.Get("Retry-After") != "2678400") {
			t.Fatalf("check %d: %s %v, want a retry on February 1", i, r.body, r.header)
		}
	}
	st := do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/acme/e?algorithm=fixed_window&limit=2&window_months=1", "")
	if st.status != 200 || st.json(t)["remaining"] != 0.0 || st.json(t)["blocked"] != true || st.json(t)["reset_at"] != float64(feb.Unix()) {
		t.Fatalf("status: %d %s", st.status, st.body)
	}
	// 31 days of seconds are another counter: a window of months counts apart.
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", `{"user_id":"acme","endpoint":"/e","algorithm":"fixed_window","limit":2,"window_seconds":2678400}`); r.status != 200 {
		t.Fatalf("check of seconds: %d %s", r.status, r.body)
	}
	now.Store(feb.UnixMilli())
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", `{"checks":[`+check+`]}`)
	mar := float64(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC).Unix())
	if res := r.json(t)["results"].([]any)[0].(map[string]any); r.status != 200 || res["allowed"] != true || res["remaining"] != 1.0 || res["reset_at"] != mar {
		t.Fatalf("batch on February 1: %d %s", r.status, r.body)
	}
}

func TestServer_AdminAuthConfigResetAudit(t *testing.T) {
	set := testSettings()
	set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	ts := startServer(t, set)
	cfg := `{"user_id":"alice","endpoint":"/api","limit":1,"window_seconds":60,"algorithm":"token_bucket"}`
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", cfg); r.status != 401 || r.errCode(t) != codeUnauthorized {
		t.Fatalf("no key: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", cfg, "X-Admin-Key", "wrong"); r.status != 403 || r.errCode(t) != codeForbidden {
		t.Fatalf("wrong key: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ body, code string }{
		{`{"user_id":"alice","endpoint":"/api","limit":0,"window_seconds":60,"algorithm":"token_bucket"}`, codeInvalidLimit},
		{`{"user_id":"alice","endpoint":"/api","limit":1,"window_seconds":60,"algorithm":"x"}`, codeInvalidAlgorithm},
		{`{"user_id":"alice","endpoint":"/api","limit":1,"window_seconds":60,"algorithm":"token_bucket","extra":1}`, codeInvalidInput},
		{`{"user_id":"alice","endpoint":"/api","limit":1,"window_seconds":60,"strategy":"token_bucket"}`, codeInvalidInput},
	} {
		if r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", tc.body, "Authorization", "Bearer admin-secret"); r.status != 400 || r.errCode(t) != tc.code {
			t.Fatalf("%s: %d %s", tc.body, r.status, r.body)
		}
	}
	if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/config/alice/api", "", "X-Admin-Key", "admin-secret"); r.status != 404 || r.errCode(t) != codeNotFound {
		t.Fatalf("get before put: %d %s", r.status, r.body)
	}
	r := do(t, nil, "PUT", ts.URL+"/v1/rate-limit/config", cfg, "Authorization", "Bearer admin-secret")
	if r.status != 200 || r.json(t)["limit"] != 1.0 || r.json(t)["updated_at"] == nil {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/v1/rate-limit/config/alice/api", "", "X-Admin-Key", "admin-secret"); r.status != 200 || r.json(t)["algorithm"] != "token_bucket" {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	// The override applies at once to REST checks and to per-user plugin limits.
	rest := `{"user_id":"alice","endpoint":"/api"}`
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", rest); r.status != 200 || r.json(t)["limit"] != 1.0 {
		t.Fatalf("first REST check: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", rest); r.status != 429 {
		t.Fatalf("second REST check: %d %s", r.status, r.body)
	}
	pl := limit("rl:{u:alice}:chat", rules.FixedWindow, 50)
	pl.PerUser = true
	wire := string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{User: "alice", Endpoint: "/api", Limits: []rules.LimitRequest{pl}}))
	var cr rules.CheckResponse
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", wire); rules.DecodeCheckResponse(r.body, 1, &cr) != nil || cr.Decisions[0].Limit != 1 {
		t.Fatalf("plugin check with override: %s", r.body)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/reset", `{"user_id":"alice","endpoint":"/api"}`, "X-Admin-Key", "admin-secret"); r.status != 200 {
		t.Fatalf("reset: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", rest); r.status != 200 {
		t.Fatalf("after reset: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/reset", `{"key":"sluice:overrides"}`, "X-Admin-Key", "admin-secret"); r.status != 400 {
		t.Fatalf("reset of a non-counter key: %d %s", r.status, r.body)
	}
	audit, err := os.ReadFile(set.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	denied := 0
	for _, l := range strings.Split(strings.TrimSpace(string(audit)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		if strings.Contains(l, "admin-secret") {
			t.Fatalf("audit log leaks the key: %s", l)
		}
		if rec["msg"] == "admin_denied" {
			denied++
			continue
		}
		actions = append(actions, rec["action"].(string))
		want := []string{"time", "who", "remote", "action", "target", "request_id"}
		if rec["action"] != "config.get" {
			want = append(want, "after") // a change
		}
		for _, f := range want {
			if rec[f] == nil {
				t.Fatalf("audit record without %s: %s", f, l)
			}
		}
	}
	if got := strings.Join(actions, ","); got != "config.get,config.put,config.get,reset" || denied != 2 {
		t.Fatalf("audit actions %s, %d denied; want config.get,config.put,config.get,reset and 2 denied", got, denied)
	}
}

func TestServer_AdminDisabledAndCheckToken(t *testing.T) {
	set := DefaultSettings()
	set.CheckToken = "tok"
	ts := startServer(t, set)
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/reset", `{"key":"rl:x"}`, "X-Admin-Key", ""); r.status != 403 {
		t.Fatalf("admin without a configured key: %d %s", r.status, r.body)
	}
	body := checkBody(limit("rl:{u:t}:a", rules.FixedWindow, 2))
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body); r.status != 401 {
		t.Fatalf("no token: %d", r.status)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body, "Authorization", "Bearer nope"); r.status != 403 {
		t.Fatalf("wrong token: %d", r.status)
	}
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body, "Authorization", "Bearer tok"); r.status != 200 {
		t.Fatalf("right token: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/healthz", ""); r.status != 200 {
		t.Fatalf("healthz needs no token: %d", r.status)
	}
}

func TestServer_RedisDownThen503ThenRecovers(t *testing.T) {
	rs := redistest.Start(t)
	set := testSettings()
	set.Store, set.RedisURL, set.RedisTimeout = "redis", rs.URL, 300*time.Millisecond
	var logs syncbuf.Buffer
	set.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	ts := startServer(t, set)
	body := checkBody(limit("rl:{u:down}:a", rules.SlidingWindow, 100))
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body); r.status != 200 {
		t.Fatalf("up: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/readyz", ""); r.status != 200 {
		t.Fatalf("readyz up: %d", r.status)
	}
	rs.Stop()
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body)
	if r.status != 503 || r.errCode(t) != codeServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("down: %d %s", r.status, r.body)
	}
	if r := do(t, nil, "GET", ts.URL+"/readyz", ""); r.status != 503 {
		t.Fatalf("readyz down: %d", r.status)
	}
	m := do(t, nil, "GET", ts.URL+"/metrics", "")
	if !strings.Contains(string(m.body), `sluice_bridge_checks_total{result="error"} 1`) || !strings.Contains(string(m.body), `sluice_bridge_store_errors_total{op="check"} 1`) {
		t.Fatalf("metrics do not count the failure:\n%s", grep(m.body, "sluice_bridge_"))
	}
	if !strings.Contains(logs.String(), `"msg":"store_error"`) {
		t.Fatalf("store error not logged: %s", logs.String())
	}
	rs.Restart()
	if r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body); r.status != 200 {
		t.Fatalf("after restart: %d %s", r.status, r.body)
	}
}

func grep(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestServer_Metrics(t *testing.T) {
	ts := startServer(t, testSettings())
	body := checkBody(limit("rl:{u:m}:a", rules.SlidingLog, 1))
	do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body)
	do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", body)
	m := string(do(t, nil, "GET", ts.URL+"/metrics", "").body)
	for _, want := range []string{
		`sluice_bridge_checks_total{result="allowed"} 1`,
		`sluice_bridge_checks_total{result="denied"} 1`,
		`sluice_bridge_decisions_total{algorithm="sliding_log",result="denied",rule="rule1"} 1`,
		// The allowed check used the whole limit of 1.
		`sluice_bridge_near_limit_total{algorithm="sliding_log",rule="rule1"} 1`,
		`sluice_bridge_check_duration_seconds_count 2`,
		`sluice_bridge_store_duration_seconds_count{op="check"} 2`,
		// Present before any failure, so rate() sees the first one.
		`sluice_bridge_store_errors_total{op="check"} 0`,
		`sluice_bridge_store_errors_total{op="ping"} 0`,
		`sluice_bridge_check_duration_seconds_bucket{le="0.2"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestServer_TLS(t *testing.T) {
	// A throwaway certificate from the httptest package.
	hs := httptest.NewUnstartedServer(nil)
	hs.StartTLS()
	cert := hs.TLS.Certificates[0]
	hs.Close()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	writePEM(t, certFile, keyFile, cert)
	set := testSettings()
	set.TLSCert, set.TLSKey = certFile, keyFile
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	defer func() { s.Shutdown(context.Background()); s.Close() }()
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections() // before the bridge's shutdown: see h2cClient
	c := &http.Client{Transport: tr}
	resp, err := c.Get("https://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
	}
}

func TestParseSettings(t *testing.T) {
	env := map[string]string{"SLUICE_STORE": "redis", "SLUICE_REDIS_URL": "redis://127.0.0.1:1/0", "SLUICE_DEFAULT_LIMIT": "7"}
	s, err := ParseSettings([]string{"--default-limit", "9", "--redis-timeout", "2s"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if s.Store != "redis" || s.RedisURL != "redis://127.0.0.1:1/0" || s.DefaultLimit != 9 || s.RedisTimeout != 2*time.Second || s.Listen != ":8081" {
		t.Fatalf("%+v", s)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--store", "disk"}, nil, "--store"},
		{[]string{"--store", "redis"}, nil, "--redis-url"},
		{[]string{"--redis-timeout", "0s"}, nil, "--redis-timeout"},
		{[]string{"--default-algorithm", "leaky"}, nil, "--default-algorithm"},
		{[]string{"--tls-cert", "x"}, nil, "--tls-key"},
		{[]string{"--log-level", "loud"}, nil, "--log-level"},
		{nil, map[string]string{"SLUICE_DEFAULT_LIMIT": "many"}, "SLUICE_DEFAULT_LIMIT"},
		{[]string{"extra"}, nil, "unexpected argument"},
	} {
		_, err := ParseSettings(tc.args, func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one naming %s", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestIdemCache_Bounded(t *testing.T) {
	c := newIdemCache(3, time.Minute)
	now := time.Unix(1000, 0)
	for i, k := range []string{"a", "b", "c", "d"} {
		c.put(k, []byte{byte(i)}, now)
	}
	if _, ok := c.get("a", now); ok {
		t.Fatal("oldest entry kept beyond the bound")
	}
	if b, ok := c.get("d", now); !ok || b[0] != 3 {
		t.Fatal("newest entry missing")
	}
	if _, ok := c.get("d", now.Add(time.Minute)); ok {
		t.Fatal("entry kept beyond its ttl")
	}
	c.put("b", []byte{9}, now)
	if b, _ := c.get("b", now); b[0] != 1 {
		t.Fatal("a replayed key must keep its first answer")
	}
}

// FuzzServer_Bodies posts arbitrary bodies to every endpoint that reads one:
// the answer is never a 5xx and always JSON.
func FuzzServer_Bodies(f *testing.F) {
	for _, s := range []string{
		checkBody(limit("rl:{u:f}:a", rules.TokenBucket, 3)),
		`{"user_id":"u","endpoint":"/e","limit":3,"window_seconds":1,"algorithm":"fixed_window"}`,
		`{"checks":[{"user_id":"u","endpoint":"/e"}],"idempotency_key":"k"}`,
		`{"key":"rl:{u:a}:x"}`, `{"limits":[{"key":"k","algorithm":"sliding_log","limit":1,"window_ms":1,"penalty":{"window_ms":1,"threshold":1,"multipliers":[2]}}]}`,
		``, `null`, `[]`, `{"user_id":1}`,
	} {
		f.Add(s)
	}
	set := testSettings()
	set.Logger = slog.New(slog.DiscardHandler)
	set.AuditLog = filepath.Join(f.TempDir(), "audit.log")
	s, err := New(set)
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, ep := range []struct{ method, path string }{
			{"POST", "/v1/rate-limit/check"}, {"POST", "/v1/rate-limit/batch-check"},
			{"PUT", "/v1/rate-limit/config"}, {"POST", "/v1/rate-limit/reset"},
		} {
			req := httptest.NewRequest(ep.method, ep.path, strings.NewReader(body))
			req.Header.Set("X-Admin-Key", "admin-secret")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s: %d %s", ep.method, ep.path, rec.Code, rec.Body)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s: not JSON: %q", ep.method, ep.path, rec.Body)
			}
		}
	})
}

// --listen unix:///path serves checks over a Unix socket, HTTP/1.1 and
// h2c alike; a socket file left behind is replaced, and one a bridge
// still listens on is not taken.
func TestServer_ListenUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bridge.sock")
	set := testSettings()
	set.Logger, set.AuditLog = discardLogger(), filepath.Join(t.TempDir(), "audit.log")
	set.Listen = "unix://" + sock
	if err := set.Validate(); err != nil {
		t.Fatal(err)
	}
	// What a bridge that did not stop cleanly leaves.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := listen(set.Listen, 0o660)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("the socket's mode: %v %v, want 0660 (--listen-mode)", fi.Mode(), err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	if _, err := listen(set.Listen, 0); err == nil || !strings.Contains(err.Error(), "another process listens on it") {
		t.Errorf("a second bridge on the socket: %v", err)
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}
	h1 := &http.Client{Transport: &http.Transport{DialContext: dial}}
	h2 := &http.Transport{DialContext: dial, Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	for i, c := range []*http.Client{h1, {Transport: h2}} {
		body := checkBody(limit("rl:{u:unix}:a", rules.FixedWindow, 2))
		r := do(t, c, "POST", "http://bridge/v1/rate-limit/check", body)
		var cr rules.CheckResponse
		if err := rules.DecodeCheckResponse(r.body, 1, &cr); err != nil || r.status != 200 || !cr.Allowed || cr.Decisions[0].Remaining != int64(1-i) {
			t.Fatalf("check %d over the socket: %d %s %v", i+1, r.status, r.body, err)
		}
	}
	h2.CloseIdleConnections()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	for _, tc := range []struct{ listen, mode, err string }{
		{"unix://bridge.sock", "", "a Unix socket needs an absolute path"},
		{":8081", "0660", "--listen-mode: only with --listen unix:///path"},
		{"unix:///run/b.sock", "rw", `--listen-mode: "rw" is not a file mode from 0001 to 0777 in octal`},
		{"unix:///run/b.sock", "01777", `--listen-mode: "01777" is not a file mode`},
	} {
		bad := testSettings()
		bad.Listen, bad.ListenMode = tc.listen, tc.mode
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("--listen %s --listen-mode %q: %v, want %q", tc.listen, tc.mode, err, tc.err)
		}
	}
}

// Settings.Validate names the setting it refuses.
func TestSettings_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Settings)
		err  string
	}{
		{"a negative age", func(s *Settings) { s.MaxConnectionAge = -time.Second }, "--max-connection-age: must not be negative"},
		{"an age with TLS", func(s *Settings) { s.MaxConnectionAge, s.TLSCert, s.TLSKey = time.Hour, "c.pem", "k.pem" },
			"--max-connection-age: not with --tls-cert"},
		{"a negative over-limit cache", func(s *Settings) { s.RLSOverLimitCache = -1 }, "--rls-over-limit-cache: must not be negative"},
		{"a negative watch", func(s *Settings) { s.Watch = -time.Second }, "--watch: must not be negative"},
		{"readiness on a configuration never given", func(s *Settings) { s.RLSReadyNeedsConfig = true }, "--rls-ready-needs-config: only with --rls-config or --rls-xds"},
		{"a negative near-limit ratio", func(s *Settings) { s.NearLimitRatio = -0.5 }, "--near-limit-ratio: -0.5 is not from 0 to 1"},
		{"a near-limit ratio above 1", func(s *Settings) { s.NearLimitRatio = 1.5 }, "--near-limit-ratio: 1.5 is not"},
		{"a near-limit ratio NaN", func(s *Settings) { s.NearLimitRatio = math.NaN() }, "--near-limit-ratio: NaN is not"},
		{"two header names", func(s *Settings) { s.RLSResponseHeaderNames = "a,b" }, "--rls-response-header-names: want three names"},
		{"a header name with a space", func(s *Settings) { s.RLSResponseHeaderNames = "a,b c,d" }, `--rls-response-header-names: "b c" is not a header name`},
		{"a pseudo-header", func(s *Settings) { s.RLSResponseHeaderNames = "a,:status,d" }, `--rls-response-header-names: ":status" is not a header name`},
		{"client CAs without TLS", func(s *Settings) { s.TLSClientCA = "ca.pem" }, "--tls-client-ca: only with --tls-cert"},
		{"client names without client CAs", func(s *Settings) { s.TLSCert, s.TLSKey, s.TLSClientSAN = "c.pem", "k.pem", "envoy" },
			"--tls-client-san: only with --tls-client-ca"},
		{"an empty client name", func(s *Settings) {
			s.TLSCert, s.TLSKey, s.TLSClientCA, s.TLSClientSAN = "c.pem", "k.pem", "ca.pem", "envoy,,x"
		}, `--tls-client-san "envoy,,x": an empty name`},
	} {
		set := testSettings()
		tc.set(&set)
		if err := set.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
	set := testSettings()
	set.MaxConnectionAge, set.RLSResponseHeaderNames = time.Hour, "X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset"
	set.NearLimitRatio = 1
	if err := set.Validate(); err != nil {
		t.Errorf("an age without TLS, three header names, a near-limit ratio of 1: %v", err)
	}
}

// TestServer_MaxConnectionAge: with --max-connection-age the bridge's
// fast paths ask clients to reconnect; an aged HTTP/1.1 connection gets
// its answer with Connection: close.
func TestServer_MaxConnectionAge(t *testing.T) {
	set := testSettings()
	set.MaxConnectionAge = time.Nanosecond
	ts := startServer(t, set)
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := checkBody(limit("rl:{u:age}:a", rules.FixedWindow, 5))
	fmt.Fprintf(c, "POST /v1/rate-limit/check HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("an aged connection's answer: %d, Connection: close %v; want 200 and close", resp.StatusCode, resp.Close)
	}
}
