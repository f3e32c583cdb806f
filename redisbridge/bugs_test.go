package redisbridge

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeClock is a memory store clock that moves only when told.
func fakeClock(set *Settings) *atomic.Int64 {
	var now atomic.Int64
	now.Store(1_767_225_600_123) // 2026-01-01T00:00:00.123Z
	set.Now = now.Load
	return &now
}

// TestServer_StatusDescribesTheCheckCounter: after a REST check with its
// own limit and algorithm, status with the same parameters reports that
// counter: its limit, what is left, and the reset the next check sees.
func TestServer_StatusDescribesTheCheckCounter(t *testing.T) {
	set := testSettings()
	now := fakeClock(&set)
	ts := startServer(t, set)
	check := `{"user_id":"u1","endpoint":"/api/x","algorithm":"token_bucket","limit":2,"window_seconds":60}`
	r := do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check)
	if r.status != 200 || r.json(t)["remaining"] != 1.0 || r.json(t)["limit"] != 2.0 {
		t.Fatalf("check: %d %s", r.status, r.body)
	}
	checkReset := r.json(t)["reset_at"]
	now.Add(10_000) // a sixth of a token refilled: still 1 whole token
	st := do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/u1/api/x?algorithm=token_bucket&limit=2&window_seconds=60", "")
	v := st.json(t)
	if st.status != 200 || v["limit"] != 2.0 || v["remaining"] != 1.0 || v["algorithm"] != "token_bucket" || v["reset_at"] != checkReset {
		t.Fatalf("status: %d %s; want limit 2, remaining 1, algorithm token_bucket, reset_at %v as the check said", st.status, st.body, checkReset)
	}
	// The next check agrees with what status said.
	r = do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check)
	if r.status != 200 || r.json(t)["remaining"] != 0.0 {
		t.Fatalf("next check: %d %s", r.status, r.body)
	}
	// Without parameters status describes the counter of a check without
	// them: the defaults (sliding_window, 100), untouched so far.
	st = do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/u1/api/x", "")
	if v := st.json(t); st.status != 200 || v["limit"] != 100.0 || v["remaining"] != 100.0 || v["algorithm"] != "sliding_window" {
		t.Fatalf("status without parameters: %d %s", st.status, st.body)
	}
}

// TestServer_StatusBlocked: status says blocked while a further unit
// would be refused, whatever the algorithm, and not before.
func TestServer_StatusBlocked(t *testing.T) {
	ts := startServer(t, testSettings())
	for _, alg := range []string{"fixed_window", "token_bucket", "sliding_window", "sliding_log"} {
		params := "algorithm=" + alg + "&limit=2&window_seconds=60"
		check := `{"user_id":"` + alg + `","endpoint":"/x","algorithm":"` + alg + `","limit":2,"window_seconds":60}`
		for i, want := range []bool{false, false, true} {
			st := do(t, nil, "GET", ts.URL+"/v1/rate-limit/status/"+alg+"/x?"+params, "")
			if v := st.json(t); st.status != 200 || v["blocked"] != want || v["remaining"] != float64(2-i) {
				t.Fatalf("%s after %d checks: %d %s, want blocked %v", alg, i, st.status, st.body, want)
			}
			do(t, nil, "POST", ts.URL+"/v1/rate-limit/check", check)
		}
	}
}

// readAudit returns the audit records written so far.
func readAudit(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		out = append(out, rec)
	}
	return out
}

// TestServer_EveryAdminRequestAudited: refusals for a missing key (401),
// a wrong key (403) and a disabled admin API (403) are audited as
// admin_denied, and reads of the config are audited as well as changes.
func TestServer_EveryAdminRequestAudited(t *testing.T) {
	for _, tc := range []struct {
		name, key, method, path, body string
		hdr                           []string
		msg, action, reason           string
	}{
		{"missing key", "k", "PUT", "/v1/rate-limit/config", `{}`, nil, "admin_denied", "config.put", "missing_key"},
		{"wrong key", "k", "POST", "/v1/rate-limit/reset", `{}`, []string{"X-Admin-Key", "nope"}, "admin_denied", "reset", "wrong_key"},
		{"disabled", "", "GET", "/v1/rate-limit/config/u/x", "", []string{"X-Admin-Key", "k"}, "admin_denied", "config.get", "disabled"},
		{"config read", "k", "GET", "/v1/rate-limit/config/u/x", "", []string{"X-Admin-Key", "k"}, "admin", "config.get", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := testSettings()
			set.AdminKey = tc.key
			set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
			ts := startServer(t, set)
			do(t, nil, tc.method, ts.URL+tc.path, tc.body, tc.hdr...)
			recs := readAudit(t, set.AuditLog)
			if len(recs) != 1 {
				t.Fatalf("%d audit records, want 1: %v", len(recs), recs)
			}
			rec := recs[0]
			if rec["msg"] != tc.msg || rec["action"] != tc.action || rec["remote"] == nil || rec["request_id"] == nil {
				t.Fatalf("audit record %v, want msg %s action %s with remote and request_id", rec, tc.msg, tc.action)
			}
			if tc.reason != "" && rec["reason"] != tc.reason {
				t.Fatalf("audit record %v, want reason %s", rec, tc.reason)
			}
			if tc.msg == "admin" && rec["target"] != "u /x" {
				t.Fatalf("audit record %v, want target %q", rec, "u /x")
			}
		})
	}
}

// TestServer_ErrorsCarryDetails: every error envelope has details naming
// the field at fault; a REST body without user_id says so.
func TestServer_ErrorsCarryDetails(t *testing.T) {
	ts := startServer(t, testSettings())
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		field                    string
	}{
		{"unknown path", "GET", "/nope", "", 404, "path"},
		{"no override", "GET", "/v1/rate-limit/config/u/x", "", 404, "path"},
		{"too large", "POST", "/v1/rate-limit/check", `{"pad":"` + strings.Repeat("x", maxBody) + `"}`, 413, "body"},
		{"malformed JSON", "POST", "/v1/rate-limit/check", `{"user_id":`, 400, "body"},
		{"malformed batch", "POST", "/v1/rate-limit/batch-check", `{"checks":`, 400, "body"},
		{"REST check without user_id", "POST", "/v1/rate-limit/check", `{"endpoint":"/x"}`, 400, "user_id"},
		{"REST check, user_id not a string", "POST", "/v1/rate-limit/check", `{"user_id":1,"endpoint":"/x"}`, 400, "user_id"},
		{"wire check, bad window", "POST", "/v1/rate-limit/check", `{"limits":[{"key":"k","algorithm":"fixed_window","limit":1,"window_ms":0}]}`, 400, "limits[0].window_ms"},
		{"config, wrong type", "PUT", "/v1/rate-limit/config", `{"user_id":"u","endpoint":"/x","limit":"many"}`, 400, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, nil, tc.method, ts.URL+tc.path, tc.body, "X-Admin-Key", "admin-secret")
			if r.status != tc.status {
				t.Fatalf("%d %s, want %d", r.status, r.body, tc.status)
			}
			r.errCode(t)
			e := r.json(t)["error"].(map[string]any)
			d, _ := e["details"].(map[string]any)
			if d == nil || d["field"] != tc.field || d["reason"] == nil || d["reason"] == "" {
				t.Fatalf("details %v, want field %q and a reason: %s", e["details"], tc.field, r.body)
			}
			if msg, _ := e["message"].(string); !strings.Contains(msg, tc.field) && tc.field != "path" && tc.field != "body" {
				t.Fatalf("message %q does not name %s", msg, tc.field)
			}
		})
	}
}
