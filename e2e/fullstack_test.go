package e2e_test

// Full-stack tests of the reference scenarios: a real redis-server, the real
// bridge, the built plugin in the wasmhost host with two worker VMs, and real HTTP
// clients going through a gateway (Host.Middleware in front of an upstream).

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/jwttest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/wasmhost"
)

// builtPlugin is the plugin as `make wasm` builds it.
func builtPlugin(t *testing.T) []byte { return e2etest.Plugin(t) }

const jwtSecret = "full-stack-test-secret-0123456789abcdef"

// stack is one running Sluice: redis, bridge, plugin host and gateway.
type stack struct {
	t       *testing.T
	redis   *redistest.Server
	bridge  *redisbridge.Server
	brAddr  string
	host    *wasmhost.Host
	gateway *httptest.Server
	client  *http.Client
}

func startBridge(t *testing.T, addr, redisURL string) *redisbridge.Server {
	t.Helper()
	set := redisbridge.DefaultSettings()
	set.Listen, set.Store, set.RedisURL = addr, "redis", redisURL
	set.RedisTimeout = 150 * time.Millisecond
	set.Logger = e2etest.Logger(t)
	set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	br, err := redisbridge.New(set)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	for i := 0; i < 50; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	go br.Serve(ln)
	return br
}

// stopBridge stops a bridge at once, as a crash would for its clients.
func stopBridge(br *redisbridge.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	br.Shutdown(ctx)
	br.Close()
}

func newStack(t *testing.T, config string) *stack {
	t.Helper()
	s := &stack{t: t, redis: redistest.Start(t)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.brAddr = ln.Addr().String()
	ln.Close()
	s.bridge = startBridge(t, s.brAddr, s.redis.URL)
	t.Cleanup(func() { stopBridge(s.bridge) })
	s.host, err = wasmhost.New(context.Background(), builtPlugin(t), wasmhost.Options{
		Workers: 2, CompilationCache: e2etest.CompilationCache(t), PluginConfig: []byte(config), RootID: "sluice",
		Clusters: map[string]string{"sluice_bridge": "http://" + s.brAddr},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.host.Close() })
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := 200
		if code, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
			status, _ = strconv.Atoi(code)
		}
		// ?status= and ?tokens= (a language model's usage header) for
		// limits charged after the response.
		if code := r.URL.Query().Get("status"); code != "" {
			status, _ = strconv.Atoi(code)
		}
		if n := r.URL.Query().Get("tokens"); n != "" {
			w.Header().Set("X-Usage-Tokens", n)
		}
		// ?usage=: a language model's answer, its usage at the end of
		// its JSON, written in two parts.
		if n := r.URL.Query().Get("usage"); n != "" {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Saw-Accept-Encoding", r.Header.Get("Accept-Encoding"))
			w.WriteHeader(status)
			io.WriteString(w, `{"choices":[{"message":{"content":"upstream"}}],`)
			io.WriteString(w, `"usage":{"total_tokens":`+n+`}}`)
			return
		}
		w.WriteHeader(status)
		io.WriteString(w, "upstream")
	})
	s.gateway = httptest.NewServer(s.host.Middleware(upstream))
	t.Cleanup(s.gateway.Close)
	s.client = &http.Client{Timeout: 5 * time.Second}
	return s
}

type reply struct {
	status int
	h      http.Header
	body   string
	took   time.Duration
}

// get sends a request as from client ip (X-Forwarded-For appended by the
// trusted proxy in front, trusted_proxy_depth 1).
func (s *stack) get(path, ip string, headers ...string) reply {
	s.t.Helper()
	req, _ := http.NewRequest("GET", s.gateway.URL+path, nil)
	req.Header.Set("X-Forwarded-For", ip)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	start := time.Now()
	res, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b), time.Since(start)}
}

func scenarioConfig(mode string) string {
	return `{
  "failure_mode": "` + mode + `",
  "bridge": {"cluster": "sluice_bridge", "timeout": "200ms"},
  "identity": {
    "sources": [
      {"type": "jwt", "claim": "sub", "keys": [{"alg": "HS256", "secret": "` + jwtSecret + `"}]},
      {"type": "header", "header": "x-user-id"}
    ],
    "client_ip": {"trusted_proxy_depth": 1}
  },
  "tiers": {"header": "x-tier", "claim": "plan", "default": "free", "list": [
    {"name": "free", "limit": 100, "window": "1m", "algorithm": "sliding_log"},
    {"name": "premium", "limit": 1000, "window": "1m", "endpoints": {"/api/v1/request": 50}},
    {"name": "quick", "limit": 3, "window": "1s", "algorithm": "fixed_window"}
  ]},
  "categories": [
    {"name": "chat", "paths": ["/api/v1/chat"]},
    {"name": "auth", "paths": ["/api/v1/login"]}
  ],
  "rules": [{"name": "search-log-only", "match": {"paths": ["/api/v1/search"]}, "limit": 2, "window": "1m", "action": "log_only"}],
  "exemptions": {"ips": ["192.0.2.200"], "users": ["ops"]},
  "headers": {"strategy": true}
}`
}

func TestFullStack_Scenarios(t *testing.T) {
	s := newStack(t, scenarioConfig("fail_open"))

	t.Run("free tier 100 per minute", func(t *testing.T) {
		var last reply
		for i := 1; i <= 100; i++ {
			last = s.get("/api/v1/items", "203.0.113.1", "X-User-Id", "free-user")
			if last.status != 200 {
				t.Fatalf("request %d: %d %s", i, last.status, last.body)
			}
		}
		if last.h.Get("X-RateLimit-Remaining") != "0" || last.h.Get("X-RateLimit-Limit") != "100" {
			t.Errorf("100th: remaining %q limit %q", last.h.Get("X-RateLimit-Remaining"), last.h.Get("X-RateLimit-Limit"))
		}
		r := s.get("/api/v1/items", "203.0.113.1", "X-User-Id", "free-user")
		ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
		if r.status != 429 || ra < 1 || ra > 60 || !strings.Contains(r.body, `"RATE_LIMITED"`) {
			t.Errorf("101st: %d Retry-After %q %s", r.status, r.h.Get("Retry-After"), r.body)
		}
	})

	t.Run("passes again after the window", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			if r := s.get("/api/v1/items", "203.0.113.2", "X-User-Id", "quick-user", "X-Tier", "quick"); r.status != 200 {
				t.Fatalf("request %d: %d", i+1, r.status)
			}
		}
		r := s.get("/api/v1/items", "203.0.113.2", "X-User-Id", "quick-user", "X-Tier", "quick")
		if r.status != 429 {
			t.Fatalf("4th in the window: %d", r.status)
		}
		ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
		time.Sleep(time.Duration(ra)*time.Second + 100*time.Millisecond)
		if r := s.get("/api/v1/items", "203.0.113.2", "X-User-Id", "quick-user", "X-Tier", "quick"); r.status != 200 {
			t.Errorf("after the window: %d", r.status)
		}
	})

	t.Run("premium endpoint override", func(t *testing.T) {
		for i := 1; i <= 50; i++ {
			if r := s.get("/api/v1/request", "203.0.113.3", "X-User-Id", "prem", "X-Tier", "premium"); r.status != 200 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		if r := s.get("/api/v1/request", "203.0.113.3", "X-User-Id", "prem", "X-Tier", "premium"); r.status != 429 || r.h.Get("X-RateLimit-Limit") != "50" {
			t.Errorf("51st: %d limit %q", r.status, r.h.Get("X-RateLimit-Limit"))
		}
		if r := s.get("/api/v1/health", "203.0.113.3", "X-User-Id", "prem", "X-Tier", "premium"); r.status != 200 || r.h.Get("X-RateLimit-Limit") != "1000" {
			t.Errorf("other endpoint: %d limit %q", r.status, r.h.Get("X-RateLimit-Limit"))
		}
	})

	t.Run("auth per ip, chat per user, independent", func(t *testing.T) {
		for i := 0; i < 5; i++ { // five different users from one IP
			if r := s.get("/api/v1/login", "198.51.100.10", "X-User-Id", fmt.Sprint("auth-u", i)); r.status != 200 {
				t.Fatalf("login %d: %d", i, r.status)
			}
		}
		if r := s.get("/api/v1/login", "198.51.100.10", "X-User-Id", "auth-new"); r.status != 429 {
			t.Errorf("6th login from the IP, new user: %d", r.status)
		}
		if r := s.get("/api/v1/login", "198.51.100.11", "X-User-Id", "auth-u0"); r.status != 200 {
			t.Errorf("login from another IP: %d", r.status)
		}
		for i := 0; i < 10; i++ { // chat: per user, from changing IPs
			if r := s.get("/api/v1/chat", fmt.Sprint("198.51.100.", 20+i), "X-User-Id", "chatter"); r.status != 200 {
				t.Fatalf("chat %d: %d", i, r.status)
			}
		}
		if r := s.get("/api/v1/chat", "198.51.100.99", "X-User-Id", "chatter"); r.status != 429 {
			t.Errorf("11th chat: %d", r.status)
		}
		if r := s.get("/api/v1/chat", "198.51.100.20", "X-User-Id", "other-chatter"); r.status != 200 {
			t.Errorf("another user's chat: %d", r.status)
		}
		if r := s.get("/api/v1/login", "198.51.100.12", "X-User-Id", "chatter"); r.status != 200 {
			t.Errorf("chatter's login (independent of chat): %d", r.status)
		}
	})

	t.Run("exempt ip and user", func(t *testing.T) {
		for i := 0; i < 8; i++ { // auth allows 5 per IP
			if r := s.get("/api/v1/login", "192.0.2.200"); r.status != 200 || r.h.Get("X-RateLimit-Limit") != "" {
				t.Fatalf("exempt ip, request %d: %d", i, r.status)
			}
			if r := s.get("/api/v1/chat", "198.51.100.50", "X-User-Id", "ops"); r.status != 200 {
				t.Fatalf("exempt user, request %d: %d", i, r.status)
			}
		}
	})

	t.Run("verified jwt across ips, forged token gains nothing", func(t *testing.T) {
		token := jwttest.HS256(jwtSecret, `{"sub":"jwt-user","exp":`+fmt.Sprint(time.Now().Add(time.Hour).Unix())+`}`)
		for i := 0; i < 10; i++ {
			if r := s.get("/api/v1/chat", fmt.Sprint("198.51.100.", 100+i), "Authorization", "Bearer "+token); r.status != 200 {
				t.Fatalf("chat %d: %d %s", i, r.status, r.body)
			}
		}
		if r := s.get("/api/v1/chat", "198.51.100.200", "Authorization", "Bearer "+token); r.status != 429 {
			t.Errorf("11th chat with the token from a new IP: %d", r.status)
		}
		// A token signed with another key claiming a fresh user is anonymous:
		// it is counted by IP, so it cannot mint new quota.
		for i := 0; i < 10; i++ {
			forged := jwttest.HS256("attacker-secret-0123456789abcdef0123", fmt.Sprintf(`{"sub":"fresh-%d"}`, i))
			if r := s.get("/api/v1/chat", "198.51.100.201", "Authorization", "Bearer "+forged); r.status != 200 {
				t.Fatalf("forged %d: %d", i, r.status)
			}
		}
		forged := jwttest.HS256("attacker-secret-0123456789abcdef0123", `{"sub":"fresh-new"}`)
		if r := s.get("/api/v1/chat", "198.51.100.201", "Authorization", "Bearer "+forged); r.status != 429 {
			t.Errorf("forged tokens minted quota: %d", r.status)
		}
		// Nor can it spend the real user's quota: a forged "jwt-user" token is anonymous too.
		victim := jwttest.HS256(jwtSecret, `{"sub":"victim","exp":`+fmt.Sprint(time.Now().Add(time.Hour).Unix())+`}`)
		forgedVictim := jwttest.HS256("attacker-secret-0123456789abcdef0123", `{"sub":"victim"}`)
		for i := 0; i < 3; i++ {
			s.get("/api/v1/chat", "198.51.100.202", "Authorization", "Bearer "+forgedVictim)
		}
		if r := s.get("/api/v1/chat", "198.51.100.203", "Authorization", "Bearer "+victim); r.status != 200 || r.h.Get("X-RateLimit-Remaining") != "9" {
			t.Errorf("victim's quota touched by forged tokens: %d remaining %q", r.status, r.h.Get("X-RateLimit-Remaining"))
		}
	})

	t.Run("headers on 200 and 5xx, log_only passes", func(t *testing.T) {
		for _, path := range []string{"/status/200", "/status/500", "/status/503"} {
			r := s.get(path, "203.0.113.9", "X-User-Id", "hdr-user")
			if r.h.Get("X-RateLimit-Limit") != "100" || r.h.Get("X-RateLimit-Remaining") == "" || r.h.Get("X-RateLimit-Reset") == "" || r.h.Get("X-RateLimit-Strategy") != "sliding_log" {
				t.Errorf("%s: %d headers %v", path, r.status, r.h)
			}
		}
		for i := 0; i < 4; i++ { // the log_only rule allows 2
			if r := s.get("/api/v1/search", "203.0.113.9", "X-User-Id", "log-only-user"); r.status != 200 {
				t.Fatalf("log_only request %d refused: %d", i, r.status)
			}
		}
		if n, _ := s.host.Metric("sluice_log_only_denied_total"); n != 2 {
			t.Errorf("log_only denials: %d, want 2", n)
		}
	})
}

func TestFullStack_ProgressivePenalty(t *testing.T) {
	s := newStack(t, `{
  "bridge": {"cluster": "sluice_bridge", "timeout": "200ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
  "rules": [{"name": "tight", "limit": 1, "window": "1s", "algorithm": "fixed_window",
    "penalty": {"detection_window": "1m", "violation_threshold": 2, "multipliers": [2, 4]}}]
}`)
	// Each episode: use the one allowed request, violate, read Retry-After,
	// wait it out. Repeated violations must lengthen the wait.
	var waits []int
	for episode := 0; episode < 3; episode++ {
		s.get("/x", "203.0.113.50", "X-User-Id", "repeat")
		r := s.get("/x", "203.0.113.50", "X-User-Id", "repeat")
		if r.status != 429 {
			// The fixed window may have rolled between the two requests.
			r = s.get("/x", "203.0.113.50", "X-User-Id", "repeat")
		}
		if r.status != 429 {
			t.Fatalf("episode %d: no denial", episode)
		}
		ra, _ := strconv.Atoi(r.h.Get("Retry-After"))
		waits = append(waits, ra)
		time.Sleep(time.Duration(ra)*time.Second + 150*time.Millisecond)
	}
	if !(waits[0] <= 1 && waits[1] >= 2 && waits[2] > waits[1]) {
		t.Errorf("Retry-After over episodes: %v, want 1, then >= 2 (×2), then longer (×4)", waits)
	}
}

func TestFullStack_FailureModes(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		t.Run(mode, func(t *testing.T) {
			s := newStack(t, scenarioConfig(mode))
			want := 200
			if mode == "fail_closed" {
				want = 503
			}
			check := func(what string, status int) {
				t.Helper()
				r := s.get("/api/v1/items", "203.0.113.77", "X-User-Id", "fm-user")
				if r.status != status {
					t.Errorf("%s: status %d, want %d (%s)", what, r.status, status, r.body)
				}
				// The configured answer comes within the call-out timeout (200ms) plus a margin.
				if r.took > 200*time.Millisecond+300*time.Millisecond {
					t.Errorf("%s: took %v", what, r.took)
				}
			}
			check("healthy", 200)

			stopBridge(s.bridge)
			check("bridge stopped", want)
			s.bridge = startBridge(t, s.brAddr, s.redis.URL)
			waitFor(t, func() bool { return s.get("/api/v1/items", "203.0.113.78", "X-User-Id", "probe").status == 200 })
			check("bridge back", 200)

			s.redis.Stop()
			check("redis stopped", want)
			s.redis.Restart()
			waitFor(t, func() bool { return s.get("/api/v1/items", "203.0.113.79", "X-User-Id", "probe2").status == 200 })
			check("redis back", 200)
			if n, _ := s.host.Metric("sluice_bridge_errors_total"); n < 2 {
				t.Errorf("bridge errors counted: %d", n)
			}
		})
	}
}

// Limits charged after the response, decided by the bridge's script on
// Redis: a token budget passes requests while it has anything left, is
// charged each response's usage, capped at what is left, and then
// refuses; failed logins are charged, successful ones are not. Requests
// of 0 tokens cost nothing, so they can watch a charge land.
// A quota of calendar months, through the plugin, the bridge and Redis:
// its 429 speaks of the month and resets on the next 1st (UTC, by Redis's
// clock, which is this machine's).
func TestFullStack_CalendarMonths(t *testing.T) {
	s := newStack(t, `{
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
  "rules": [{"name": "plan", "match": {"paths": ["/api/v1/plan"]}, "limit": 3, "window": "1mo", "algorithm": "fixed_window"}],
  "headers": {"draft": true}
}`)
	nextFirst := func() int64 {
		now := time.Now().UTC()
		return time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC).Unix()
	}
	before := nextFirst()
	for i := 1; i <= 3; i++ {
		if r := s.get("/api/v1/plan", "203.0.113.70", "X-User-Id", "planner"); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	r := s.get("/api/v1/plan", "203.0.113.70", "X-User-Id", "planner")
	after := nextFirst()
	reset, _ := strconv.ParseInt(r.h.Get("X-RateLimit-Reset"), 10, 64)
	if r.status != 429 || (reset != before && reset != after) {
		t.Fatalf("4th: %d, X-RateLimit-Reset %d, want the next 1st, %d", r.status, reset, after)
	}
	retry, _ := strconv.ParseInt(r.h.Get("Retry-After"), 10, 64)
	if d := reset - time.Now().Unix(); retry < d-2 || retry > d+2 {
		t.Errorf("Retry-After %d, want about %d (to the next 1st)", retry, d)
	}
	if !strings.Contains(r.body, "3 requests per 1mo allowed") || r.h.Get("RateLimit-Policy") != `"plan";q=3;w=2635200` {
		t.Errorf("429: %s, RateLimit-Policy %q", r.body, r.h.Get("RateLimit-Policy"))
	}
}

func TestFullStack_ChargeOnResponse(t *testing.T) {
	s := newStack(t, `{
  "bridge": {"cluster": "sluice_bridge", "timeout": "500ms"},
  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
  "rules": [
    {"name": "tokens", "match": {"paths": ["/v1/**"]}, "limit": 100, "window": "1h", "algorithm": "fixed_window",
     "on_response": {"statuses": ["2xx"], "cost_header": "x-usage-tokens"}},
    {"name": "logins", "match": {"paths": ["/login"]}, "scope": "ip", "limit": 2, "window": "1h", "algorithm": "sliding_log",
     "on_response": {"statuses": [401]}},
    {"name": "llm", "match": {"paths": ["/llm/**"]}, "limit": 50, "window": "1h", "algorithm": "token_bucket",
     "on_response": {"cost_body": "usage.total_tokens"}}]
}`)
	const ip = "203.0.113.90"
	remaining := func(want string) func() bool {
		return func() bool {
			r := s.get("/v1/chat?tokens=0", ip, "X-User-Id", "alice")
			return r.status == 200 && r.h.Get("X-RateLimit-Remaining") == want
		}
	}
	if r := s.get("/v1/chat?tokens=60", ip, "X-User-Id", "alice"); r.status != 200 || r.h.Get("X-RateLimit-Remaining") != "100" {
		t.Fatalf("first request: %d %v", r.status, r.h)
	}
	waitFor(t, remaining("40"))
	if r := s.get("/v1/chat?tokens=60", ip, "X-User-Id", "alice"); r.status != 200 {
		t.Fatalf("second request: %d", r.status)
	}
	waitFor(t, func() bool { return s.get("/v1/chat?tokens=0", ip, "X-User-Id", "alice").status == 429 })
	if r := s.get("/v1/chat?tokens=1", ip, "X-User-Id", "bob"); r.status != 200 || r.h.Get("X-RateLimit-Remaining") != "100" {
		t.Errorf("another user: %d %v", r.status, r.h)
	}

	if r := s.get("/login?status=200", ip); r.status != 200 {
		t.Fatalf("a login that succeeds: %d", r.status)
	}
	for range 2 {
		if r := s.get("/login?status=401", ip); r.status != 401 {
			t.Fatalf("a failed login: %d", r.status)
		}
	}
	waitFor(t, func() bool { return s.get("/login?status=200", ip).status == 429 })

	// The usage in the answer's body, through the gateway's middleware.
	// Go's client asks for gzip; the upstream must not see it.
	if r := s.get("/llm/chat?usage=45", ip, "X-User-Id", "carol", "Accept-Encoding", "gzip"); r.status != 200 ||
		!strings.Contains(r.body, `"total_tokens":45`) || r.h.Get("X-Saw-Accept-Encoding") != "" {
		t.Fatalf("an answer: %d %q, the upstream saw Accept-Encoding %q", r.status, r.body, r.h.Get("X-Saw-Accept-Encoding"))
	}
	waitFor(t, func() bool {
		r := s.get("/llm/chat?usage=0", ip, "X-User-Id", "carol")
		n, _ := strconv.Atoi(r.h.Get("X-RateLimit-Remaining"))
		return r.status == 200 && n >= 5 && n <= 6 // 5 left, and what the bucket refilled since
	})
	if n, _ := s.host.Metric("sluice_charge_errors_total"); n != 0 {
		t.Errorf("%d charge errors", n)
	}
	if n, _ := s.host.Metric("sluice_charges_total"); n != 6 {
		t.Errorf("%d charges, want 6 (alice's two, bob's, two failed logins, carol's)", n)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if ok() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("service did not resume within 5s")
}
