package redisbridge

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/inproc"
	"github.com/sluicehq/sluice/internal/pwmap"
	"github.com/sluicehq/sluice/redisbridge/internal/checkio"
	"github.com/sluicehq/sluice/redisbridge/internal/store"
	"github.com/sluicehq/sluice/redisbridge/redistest"
	"github.com/sluicehq/sluice/rules"
)

// rawClient sends requests on one keep-alive HTTP/1.1 connection, as the
// plugin does: the bridge's fast path answers them.
type rawClient struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, url string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{c: c, r: bufio.NewReader(c)}
}

func (rc *rawClient) post(t *testing.T, body string, hdr ...string) reply {
	t.Helper()
	var extra strings.Builder
	for i := 0; i+1 < len(hdr); i += 2 {
		extra.WriteString(hdr[i] + ": " + hdr[i+1] + "\r\n")
	}
	if _, err := io.WriteString(rc.c, postCheck(body, extra.String())); err != nil {
		t.Fatal(err)
	}
	resp, b := rawResponse(t, rc.r)
	return reply{resp.StatusCode, resp.Header, []byte(b)}
}

// TestServer_TransportsAnswerAlike: the HTTP/1.1 fast path and net/http
// (over h2c) give the same answer, headers and body, to every kind of
// check request: they share one check core.
func TestServer_TransportsAnswerAlike(t *testing.T) {
	set := testSettings()
	set.CheckToken = "tok"
	fast, std := startServer(t, set), &testServer{URL: "http://" + startNetHTTP(t, set)}
	raw := dialRaw(t, fast.URL)
	h2c := h2cClient(t)
	wire := checkBody(limit("rl:{u:same}:a", rules.FixedWindow, 2), limit("rl:{u:same}:b", rules.TokenBucket, 5))
	auth := []string{"Authorization", "Bearer tok", "X-Request-Id", "id-1"}
	for _, tc := range []struct {
		name string
		body string
		hdr  []string
	}{
		{"allowed", wire, auth}, {"allowed, last", wire, auth}, {"denied", wire, auth},
		{"invalid", `{"limits":[{"key":""}]}`, auth},
		{"not JSON", `{"limits":`, auth},
		{"REST allowed", `{"user_id":"u","endpoint":"/x","limit":1}`, auth},
		{"REST limited", `{"user_id":"u","endpoint":"/x","limit":1}`, auth},
		{"REST invalid", `{"endpoint":"/x"}`, auth},
		{"no token", wire, []string{"X-Request-Id", "id-1"}},
		{"empty request id", wire, []string{"Authorization", "Bearer tok", "X-Request-Id", ""}},
		{"wrong token", wire, []string{"Authorization", "Bearer nope", "X-Request-Id", "id-1"}},
	} {
		a := raw.post(t, tc.body, tc.hdr...)
		b := do(t, h2c, "POST", std.URL+"/v1/rate-limit/check", tc.body, tc.hdr...)
		for _, h := range []http.Header{a.header, b.header} {
			h.Del("Date")
			if id := h.Get("X-Request-Id"); strings.HasPrefix(id, "req_") { // made up: differs
				h.Set("X-Request-Id", "req_*")
			}
		}
		a.body, b.body = reqIDRe.ReplaceAll(a.body, []byte("req_*")), reqIDRe.ReplaceAll(b.body, []byte("req_*"))
		if a.status != b.status || string(a.body) != string(b.body) || !maps.EqualFunc(a.header, b.header, slices.Equal) {
			t.Errorf("%s: fast path and net/http differ:\nfast  %d %v %s\nh2c   %d %v %s", tc.name, a.status, a.header, a.body, b.status, b.header, b.body)
		}
	}
}

// deadlineStore records the deadline each check is given.
type deadlineStore struct {
	store.Store
	deadlines chan time.Duration
}

func (d *deadlineStore) Check(ctx context.Context, deadline time.Time, req *rules.CheckRequest, resp *rules.CheckResponse) error {
	left := time.Duration(-1)
	if !deadline.IsZero() {
		left = time.Until(deadline)
	}
	d.deadlines <- left
	return d.Store.Check(ctx, deadline, req, resp)
}

// TestServer_CheckDeadline: whatever the transport, a check reaches the
// store with a deadline of --redis-timeout.
func TestServer_CheckDeadline(t *testing.T) {
	set := testSettings()
	set.RedisTimeout = 42 * time.Second
	ds := &deadlineStore{deadlines: make(chan time.Duration, 10)}
	ts := startServerWith(t, set, func(s *Server) { ds.Store = s.store; s.store = ds })
	wire := checkBody(limit("rl:{u:dl}:a", rules.FixedWindow, 5))
	for _, tc := range []struct {
		name string
		send func()
	}{
		{"fast path", func() { dialRaw(t, ts.URL).post(t, wire) }},
		{"h2c", func() { do(t, h2cClient(t), "POST", ts.URL+"/v1/rate-limit/check", wire) }},
		{"REST", func() { dialRaw(t, ts.URL).post(t, `{"user_id":"u","endpoint":"/x"}`) }},
		{"batch", func() {
			do(t, nil, "POST", ts.URL+"/v1/rate-limit/batch-check", `{"checks":[{"user_id":"u","endpoint":"/x"}]}`)
		}},
	} {
		tc.send()
		if left := <-ds.deadlines; left <= 0 || left > set.RedisTimeout {
			t.Errorf("%s: the store had %v left, want a deadline within --redis-timeout (%v)", tc.name, left, set.RedisTimeout)
		}
	}
}

// BenchmarkServer_ServeCheck is the check core on the memory store, as a
// transport calls it: allocations per check.
func BenchmarkServer_ServeCheck(b *testing.B) {
	set := testSettings()
	set.Logger = discardLogger()
	set.AuditLog = b.TempDir() + "/audit"
	s, err := New(set)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	bodies := benchBodies(rules.TokenBucket)
	var out checkio.Response
	in := checkio.Request{RequestID: []byte("bench")}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		in.Body = bodies[i%len(bodies)]
		i++
		out.Reset()
		s.serveCheck(context.Background(), &in, &out)
		if out.Status != 200 {
			b.Fatalf("%d %s", out.Status, out.Body)
		}
	}
}

func TestNearLimit(t *testing.T) {
	fixed := rules.LimitRequest{Spec: rules.LimitSpec{Algorithm: rules.FixedWindow, Limit: 10, Cost: 1}}
	fill := fixed
	fill.Fill, fill.Spec.Cost = true, 3
	peek := fill
	peek.Spec.Cost = 0
	for _, tc := range []struct {
		name  string
		l     rules.LimitRequest
		d     rules.Decision
		ratio float64
		want  bool
	}{
		{"8 of 10 used: at the threshold, not past it", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: 2}, 0.8, false},
		{"9 of 10 used", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: 1}, 0.8, true},
		{"10 of 10 used", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: 0}, 0.8, true},
		{"a refusal is over, not near", fixed, rules.Decision{Allowed: false, Limit: 10, Remaining: 0}, 0.8, false},
		{"a ratio of 1: never", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: 0}, 1, false},
		{"a small ratio", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: 8}, 0.1, true},
		{"a fill limit: what it had before, less what it took", fill, rules.Decision{Allowed: true, Limit: 10, Remaining: 4}, 0.8, true},
		{"a fill limit with room", fill, rules.Decision{Allowed: true, Limit: 10, Remaining: 5}, 0.8, false},
		{"a peek takes nothing", peek, rules.Decision{Allowed: true, Limit: 10, Remaining: 1}, 0.8, false},
		{"a throttle's reservation past the limit", fixed, rules.Decision{Allowed: true, Limit: 10, Remaining: -3}, 0.8, true},
		{"floor(limit × ratio): 7 of 9 used at 0.75 is past 6", fixed, rules.Decision{Allowed: true, Limit: 9, Remaining: 2}, 0.75, true},
	} {
		if got := nearLimit(&tc.l, &tc.d, tc.ratio); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An embedded bridge on Redis answers a call-out by its deadline, which
// comes in the request rather than in the context (inproc.Request): with
// Redis paused, the check fails at the call-out's deadline, long before
// the store's own timeout, as it would have with a context that ended
// then. A check that waited for Redis would return when the pause ends,
// 15 times later, and pass.
func TestEmbedded_CalloutDeadlineOnRedis(t *testing.T) {
	rs := redistest.Start(t)
	set := DefaultSettings()
	set.Store, set.RedisURL, set.RedisTimeout, set.Logger = "redis", rs.URL, time.Minute, slog.New(slog.DiscardHandler)
	set.AuditLog = filepath.Join(t.TempDir(), "audit")
	s, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	srv := s.Handler().(inproc.Server)
	body := rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{Limits: []rules.LimitRequest{{Key: "rl:{u:a}:x", Rule: "api",
		Spec: rules.LimitSpec{Algorithm: rules.FixedWindow, Limit: 10, Burst: 10, WindowMS: 60_000, Cost: 1}}}})
	headers := pwmap.Append(nil, [][2]string{{":method", "POST"}, {":path", checkPath}, {":authority", "bridge"}})
	check := func(deadline time.Time) int {
		var res inproc.Response
		srv.ServeCallout(context.Background(), &inproc.Request{Headers: headers, Body: body, Deadline: deadline}, &res)
		return res.Status
	}
	if got := check(time.Now().Add(time.Minute)); got != http.StatusOK {
		t.Fatalf("before the pause: %d", got)
	}
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	if err := rc.Do(context.Background(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if got := check(time.Now().Add(100 * time.Millisecond)); got != http.StatusServiceUnavailable {
		t.Errorf("paused: %d, want 503 at the call-out's deadline", got)
	}
}
