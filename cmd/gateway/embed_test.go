package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/wasmhost"
)

// calloutAnswer is what the test guest got from a call-out: its local
// reply when the call-out failed, else the answer's status, headers and
// body.
type calloutAnswer struct {
	local                 int
	status, headers, body string
	localBody, failure    string
}

// embeddedPair is the same bridge twice, each embedded in a host of the
// test guest: one answers the guest's checks through net/http (its
// ServeHTTP), the other from their bytes (internal/inproc). Both start
// empty, keep the same clock and ask for the same check token.
type embeddedPair struct {
	viaHTTP, inProcess *wasmhost.Host
}

// httpOnly hides every method of a handler but ServeHTTP.
type httpOnly struct{ h http.Handler }

func (o httpOnly) ServeHTTP(w http.ResponseWriter, r *http.Request) { o.h.ServeHTTP(w, r) }

func newEmbeddedPair(t testing.TB) embeddedPair {
	t.Helper()
	host := func(i int, wrap func(http.Handler) http.Handler) *wasmhost.Host {
		set := redisbridge.DefaultSettings()
		set.Logger = discardLogger()
		set.AuditLog = filepath.Join(t.TempDir(), "audit"+strconv.Itoa(i)+".log")
		set.CheckToken = "t0ken"
		set.Now = func() int64 { return 1_800_000_000_000 }
		br, err := redisbridge.New(set)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { br.Close() })
		h, err := wasmhost.New(context.Background(), guest(t), wasmhost.Options{PluginConfig: []byte(guestConfig), Logger: discardLogger(),
			Handlers: map[string]http.Handler{"backend": wrap(br.Handler())}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	return embeddedPair{
		viaHTTP:   host(0, func(h http.Handler) http.Handler { return httpOnly{h} }),
		inProcess: host(1, func(h http.Handler) http.Handler { return h }),
	}
}

// sortedHeaders is a's headers in name order: through net/http they come
// in the order of a map.
func sortedHeaders(a calloutAnswer) string {
	hs := strings.Split(strings.TrimSuffix(a.headers, "\t"), "\t")
	slices.Sort(hs)
	return strings.Join(hs, "\t")
}

// generatedID is a request id the bridge makes up for a call without one.
var generatedID = regexp.MustCompile(`req_[0-9a-f]{24}`)

// callout has the test guest on h send a call-out with headers (the
// guest's x-callout-* request headers) and returns what it got, with the
// bridge's made-up request ids masked.
func callout(t testing.TB, h *wasmhost.Host, headers ...string) calloutAnswer {
	t.Helper()
	var got calloutAnswer
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.status, got.headers, got.body = r.Header.Get("X-Callout-Status"), r.Header.Get("X-Callout-Headers"), r.Header.Get("X-Callout-Body")
	})
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Mode", "callout")
	// Far beyond any answer's time: under a fuzzer's load a stall of the
	// test process past the guest's default second would make one of a
	// pair a 504 and the other an answer.
	req.Header.Set("X-Timeout", "60000")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.Middleware(upstream).ServeHTTP(rec, req)
	if got.status == "" {
		got.local, got.localBody, got.failure = rec.Code, rec.Body.String(), rec.Header().Get("X-Callout-Failure")
	}
	mask := func(s *string) { *s = generatedID.ReplaceAllString(*s, "req_*") }
	mask(&got.headers)
	mask(&got.body)
	return got
}

// checkBody is a check of one limit, as the plugin sends it.
func checkBody(key string) string {
	spec := rules.LimitSpec{Algorithm: rules.FixedWindow, Limit: 2, Burst: 2, WindowMS: 60_000, Cost: 1}
	return string(rules.AppendCheckRequestFrom(nil, &rules.CheckRequest{RequestID: "", Limits: []rules.LimitRequest{{Key: key, Rule: "api", Spec: spec}}}))
}

// The embedded bridge answers the plugin's call-outs from their bytes as it
// answers them through net/http: the same status, headers and body, in
// every case its check endpoint has (allowed, refused, a token missing or
// wrong, a body it cannot read or over its limit, a request id sent or
// made up) and on other endpoints and methods, which go to net/http.
func TestEmbeddedBridge_InProcess(t *testing.T) {
	p := newEmbeddedPair(t)
	const check = "/v1/rate-limit/check"
	auth := "Bearer t0ken"
	for _, tc := range []struct {
		name    string
		headers []string
	}{
		{"allowed", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k1"), "x-callout-header-authorization", auth, "x-callout-header-x-request-id", "r1"}},
		{"allowed again", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k1"), "x-callout-header-authorization", auth, "x-callout-header-x-request-id", "r2"}},
		{"refused", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k1"), "x-callout-header-authorization", auth, "x-callout-header-x-request-id", "r3"}},
		{"a request id made up", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k2"), "x-callout-header-authorization", auth}},
		{"an empty request id", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k2"), "x-callout-header-authorization", auth, "x-callout-header-x-request-id", ""}},
		{"no token", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k3"), "x-callout-header-x-request-id", "r4"}},
		{"a wrong token", []string{"x-callout-path", check, "x-callout-send-body", checkBody("k3"), "x-callout-header-authorization", "Bearer nope"}},
		{"not a check", []string{"x-callout-path", check, "x-callout-send-body", `{"limits":[{}]}`, "x-callout-header-authorization", auth}},
		{"not JSON", []string{"x-callout-path", check, "x-callout-send-body", `{`, "x-callout-header-authorization", auth}},
		{"a REST check", []string{"x-callout-path", check, "x-callout-send-body", `{"user_id":"u","endpoint":"/e"}`, "x-callout-header-authorization", auth}},
		{"over the body limit", []string{"x-callout-path", check, "x-callout-send-body", "x", "x-callout-send-body-times", strconv.Itoa(64<<10 + 1), "x-callout-header-authorization", auth}},
		{"at the body limit", []string{"x-callout-path", check, "x-callout-send-body", " ", "x-callout-send-body-times", strconv.Itoa(64 << 10), "x-callout-header-authorization", auth}},
		{"with a query: net/http", []string{"x-callout-path", check + "?a=1", "x-callout-send-body", checkBody("k4"), "x-callout-header-authorization", auth}},
		{"another method: net/http", []string{"x-callout-path", check, "x-callout-method", "PUT", "x-callout-header-authorization", auth}},
		{"another endpoint: net/http", []string{"x-callout-path", "/readyz", "x-callout-method", "GET"}},
	} {
		if err := p.compare(t, tc.headers...); err != "" {
			t.Errorf("%s: %s", tc.name, err)
		}
	}
}

// compare sends the same call-out through both bridges of p, and says how
// their answers differ; "" when they do not.
func (p embeddedPair) compare(t testing.TB, headers ...string) string {
	t.Helper()
	viaHTTP, inProcess := callout(t, p.viaHTTP, headers...), callout(t, p.inProcess, headers...)
	if viaHTTP.status == "" && viaHTTP.local == 0 {
		return fmt.Sprintf("the guest got nothing: %+v", viaHTTP)
	}
	if sortedHeaders(viaHTTP) != sortedHeaders(inProcess) || viaHTTP.body != inProcess.body || viaHTTP.status != inProcess.status ||
		viaHTTP.local != inProcess.local || viaHTTP.localBody != inProcess.localBody || viaHTTP.failure != inProcess.failure {
		return fmt.Sprintf("\nthrough net/http %+v\nin process       %+v", viaHTTP, inProcess)
	}
	return ""
}

// carriable is s without the bytes a header value cannot carry and the
// spaces the host would trim from its ends.
func carriable(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' && r != '\t' || r == 0x7f {
			return -1
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

// FuzzEmbeddedBridge_InProcess is TestEmbeddedBridge_InProcess for any
// check body, token and request id a plugin could send.
func FuzzEmbeddedBridge_InProcess(f *testing.F) {
	f.Add(checkBody("k"), "Bearer t0ken", "r1", true, true)
	f.Add(checkBody("k"), "Bearer t0ken", "", true, false)
	f.Add(checkBody("k"), "Bearer nope", "r2", true, true)
	f.Add(checkBody("k"), "", "r3", false, true)
	f.Add(`{"user_id":"u","endpoint":"/e"}`, "Bearer t0ken", "r4", true, true)
	f.Add(`{"limits":[{"key":"k","rule":"r","algorithm":"token_bucket","limit":1,"burst":1,"window_ms":1000,"cost":1}]}`, "Bearer t0ken", "r5", true, true)
	f.Add(`{`, "Bearer t0ken", "r6", true, true)
	p := newEmbeddedPair(f)
	f.Fuzz(func(t *testing.T, body, auth, requestID string, withAuth, withID bool) {
		// Each travels in a request header of the test guest's: made a
		// value a header can carry, unchanged through the host.
		body, auth, requestID = carriable(body), carriable(auth), carriable(requestID)
		headers := []string{"x-callout-path", "/v1/rate-limit/check", "x-callout-send-body", body}
		if withAuth {
			headers = append(headers, "x-callout-header-authorization", auth)
		}
		if withID {
			headers = append(headers, "x-callout-header-x-request-id", requestID)
		}
		if err := p.compare(t, headers...); err != "" {
			t.Error(err)
		}
	})
}
