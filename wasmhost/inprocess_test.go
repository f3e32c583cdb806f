package wasmhost

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/hosttest"
	"github.com/sluicehq/sluice/internal/inproc"
	"github.com/sluicehq/sluice/internal/pwmap"
)

// TestHost_InProcessCluster covers what an in-process cluster answers that
// the call-out table (TestHost_Callout) does not: the request its handler
// sees, a panic before and after the answer began, a body over the limit.
func TestHost_InProcessCluster(t *testing.T) {
	var logs bytes.Buffer
	h := newHost(t, Options{MaxCalloutBody: 80, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handlers: map[string]http.Handler{"backend": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/request":
				b, _ := io.ReadAll(r.Body)
				w.WriteHeader(http.StatusContinue) // informational: skipped
				io.WriteString(w, r.Method+" "+r.RequestURI+" "+r.Host+" "+r.URL.String()+" "+r.RemoteAddr+" "+string(b))
			case "/panic-first":
				panic("before the answer")
			case "/panic-midway":
				io.WriteString(w, "part")
				panic("midway")
			case "/big":
				io.WriteString(w, strings.Repeat("x", 81))
			}
		})}})
	callout := func(path string) []string { return []string{"x-callout-path", path} }
	for _, tt := range []struct {
		hosttest.Callout
		logsAPanic bool
	}{
		{Callout: hosttest.Callout{Name: "request", Headers: callout("/request?q=1"), Body: "POST /request?q=1 backend.local /request?q=1 in-process payload", Status: "200"}},
		{Callout: hosttest.Callout{Name: "panic first", Headers: callout("/panic-first"), Body: hosttest.TerminatedBody, Status: "503"}, logsAPanic: true},
		{Callout: hosttest.Callout{Name: "panic midway", Headers: callout("/panic-midway"), Local: 503, Body: "call-out failed", Status: "11 reset"}, logsAPanic: true},
		{Callout: hosttest.Callout{Name: "big", Headers: callout("/big"), Local: 503, Body: "call-out failed", Status: "11 reset"}},
	} {
		t.Run(tt.Name, func(t *testing.T) {
			logs.Reset()
			checkCallout(t, h, tt.Callout)
			if got := strings.Contains(logs.String(), "panicked"); got != tt.logsAPanic {
				t.Errorf("panic logged = %v, want %v: %s", got, tt.logsAPanic, logs.String())
			}
		})
	}
}

func TestNew_ClusterInClustersAndHandlers(t *testing.T) {
	_, err := New(context.Background(), guestWasm, Options{CompilationCache: cache,
		Clusters: map[string]string{"backend": "http://127.0.0.1:1"}, Handlers: map[string]http.Handler{"backend": http.NotFoundHandler()}})
	if err == nil || !strings.Contains(err.Error(), `cluster "backend" is in both Clusters and Handlers`) {
		t.Fatalf("err = %v", err)
	}
}

// calloutServer is an in-process cluster's handler that answers the
// call-outs it Serves, all but /seen, as inproc.Server by running h on the
// request they make; it notes which way each call-out went.
type calloutServer struct {
	h   http.Handler
	mu  sync.Mutex
	way map[string]string // by path: "ServeHTTP" or "ServeCallout"
}

func (s *calloutServer) note(path, way string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.way[path] = way
}

func (s *calloutServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.note(r.URL.Path, "ServeHTTP")
	s.h.ServeHTTP(w, r)
}

func (s *calloutServer) Serves(method, path []byte) bool { return string(path) != "/seen" }

func (s *calloutServer) ServeCallout(ctx context.Context, req *inproc.Request, res *inproc.Response) {
	var method, path, authority string
	header := http.Header{}
	_ = pwmap.Visit(req.Headers, func(k, v []byte) {
		switch string(k) {
		case ":method":
			method = string(v)
		case ":path":
			path = string(v)
		case ":authority":
			authority = string(v)
		default:
			header.Add(string(k), string(v))
		}
	})
	s.note(path, "ServeCallout")
	if !req.Deadline.IsZero() { // h waits on its request's context
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	r := httptest.NewRequestWithContext(ctx, method, path, bytes.NewReader(req.Body))
	r.Host, r.Header = authority, header
	rec := httptest.NewRecorder() // neither a Hijacker nor a writer of 1xx: a hijack panics
	s.h.ServeHTTP(rec, r)
	res.Status = rec.Code
	for k, vs := range rec.Header() {
		res.Set(k, []byte(vs[0]))
	}
	res.Body = append(res.Body, rec.Body.Bytes()...)
}

// An in-process cluster's handler that is an inproc.Server answers the
// call-outs it serves, those of the call-out table, as its ServeHTTP would,
// but for a reset midway: a ServeCallout has no answer until it returns,
// so one that panics fails as a connection closed before the answer.
func TestHost_InProcessServer(t *testing.T) {
	srv := &calloutServer{h: hosttest.Backend(t).Config.Handler, way: map[string]string{}}
	h := newHost(t, Options{Workers: 2, Handlers: map[string]http.Handler{"backend": srv}, Logger: slog.New(slog.DiscardHandler),
		Clusters: map[string]string{"down": "http://127.0.0.1:1"}})
	for _, tt := range hosttest.Callouts {
		if tt.Name == "reset after headers" {
			tt.Local, tt.Body, tt.Status = 0, hosttest.TerminatedBody, "503"
		}
		t.Run(tt.Name, func(t *testing.T) { checkCallout(t, h, tt) })
	}
	want := map[string]string{"/check/1": "ServeCallout", "/seen": "ServeHTTP", "/deny": "ServeCallout", "/slow": "ServeCallout",
		"/close": "ServeCallout", "/reset": "ServeCallout", "/redirect": "ServeCallout"}
	if !maps.Equal(srv.way, want) {
		t.Errorf("ways = %v, want %v", srv.way, want)
	}
}

// What an inproc.Server's answer becomes for the plugin: its status (none
// or an informational one, 200), its headers by lower-case name, and the
// body's length unless it set one.
func TestHost_InProcessServerAnswer(t *testing.T) {
	h := newHost(t, Options{Handlers: map[string]http.Handler{"backend": answerServer{}}})
	for _, tc := range []struct{ path, status, headers string }{
		{"/plain", "200", ":status: 200\tcontent-length: 4\tx-a: 1\tx-b: 2\t"},
		{"/created", "201", ":status: 201\tcontent-length: 4\tx-a: 1\tx-b: 2\t"},
		{"/continue", "200", ":status: 200\tcontent-length: 4\tx-a: 1\tx-b: 2\t"},
		{"/sized", "200", ":status: 200\tx-a: 1\tx-b: 2\tContent-Length: 4\t"},
	} {
		r, err := run(t, h, "x-mode", "callout", "x-callout-path", tc.path, "x-callout-header-x-in", "in")
		if err != nil {
			t.Fatal(err)
		}
		got := mustGet(t, r, "x-callout-headers")
		if want := strings.Replace(tc.headers, "Content-Length", "content-length", 1); got != want {
			t.Errorf("%s: headers %q, want %q", tc.path, got, want)
		}
		if got := mustGet(t, r, "x-callout-body"); got != "body" {
			t.Errorf("%s: body %q", tc.path, got)
		}
	}
}

// An inproc.Server has the call-out's timeout as the request's Deadline,
// none without a timeout, and not in its context, which ends only when the
// host closes; an answer that comes after the deadline is the timeout's
// 504 all the same.
func TestHost_InProcessServerDeadline(t *testing.T) {
	srv := &deadlineServer{}
	h := newHost(t, Options{Handlers: map[string]http.Handler{"backend": srv}})
	for _, tc := range []struct {
		timeout time.Duration
		path    string
		want    hosttest.Callout
	}{
		{0, "/", hosttest.Callout{Body: "ok", Status: "200"}},
		{time.Minute, "/", hosttest.Callout{Body: "ok", Status: "200"}},
		{20 * time.Millisecond, "/late", hosttest.Callout{Body: "upstream request timeout", Status: "504"}},
	} {
		tc.want.Name = fmt.Sprintf("%v %s", tc.timeout, tc.path)
		tc.want.Headers = []string{"x-callout-path", tc.path, "x-timeout", strconv.Itoa(int(tc.timeout.Milliseconds()))}
		before := time.Now()
		checkCallout(t, h, tc.want)
		after := time.Now()
		srv.mu.Lock()
		d, ctxDeadline := srv.deadline, srv.ctxDeadline
		srv.mu.Unlock()
		switch {
		case ctxDeadline:
			t.Errorf("%s: the context has a deadline", tc.want.Name)
		case tc.timeout == 0 && !d.IsZero():
			t.Errorf("%s: deadline %v, want none", tc.want.Name, d)
		case tc.timeout > 0 && (d.Before(before.Add(tc.timeout)) || d.After(after.Add(tc.timeout))):
			t.Errorf("%s: deadline %v, want %v after the call-out went out (%v to %v)", tc.want.Name, d, tc.timeout, before, after)
		}
	}
}

// deadlineServer answers "ok", on /late once the call-out's deadline has
// passed, and notes the deadline it was given and whether its context had
// one.
type deadlineServer struct {
	http.Handler
	mu          sync.Mutex
	deadline    time.Time
	ctxDeadline bool
}

func (*deadlineServer) Serves(method, path []byte) bool { return true }

func (s *deadlineServer) ServeCallout(ctx context.Context, req *inproc.Request, res *inproc.Response) {
	_, ctxDeadline := ctx.Deadline()
	s.mu.Lock()
	s.deadline, s.ctxDeadline = req.Deadline, ctxDeadline
	s.mu.Unlock()
	if calloutPath(req) == "/late" {
		time.Sleep(time.Until(req.Deadline) + time.Millisecond)
	}
	res.Body = append(res.Body, "ok"...)
}

// answerServer answers every call-out with body "body" and headers x-a
// and x-b (x-a set twice: the last value stands); /created with 201,
// /continue with 100, /sized with its Content-Length set.
type answerServer struct{ http.Handler }

func (answerServer) Serves(method, path []byte) bool { return true }

func (answerServer) ServeCallout(ctx context.Context, req *inproc.Request, res *inproc.Response) {
	if string(req.Header("X-In")) != "in" || string(req.Body) != "payload" {
		return // a 200 without headers or body: the test fails
	}
	res.Set("X-A", []byte("0"))
	res.Set("X-B", []byte("2"))
	res.Set("X-A", []byte("1"))
	switch calloutPath(req) {
	case "/created":
		res.Status = http.StatusCreated
	case "/continue":
		res.Status = http.StatusContinue
	case "/sized":
		res.Set("Content-Length", []byte("4"))
	}
	res.Body = append(res.Body, "body"...)
}

// calloutPath is req's :path.
func calloutPath(req *inproc.Request) (p string) {
	_ = pwmap.Visit(req.Headers, func(k, v []byte) {
		if string(k) == ":path" {
			p = string(v)
		}
	})
	return p
}
