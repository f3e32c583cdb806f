package wasmhost

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
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
	for _, tt := range []struct {
		path       string
		local      int
		body       string
		status     string // x-callout-status, or x-callout-failure on a local reply
		logsAPanic bool
	}{
		{path: "/request?q=1", body: "POST /request?q=1 backend.local /request?q=1 in-process payload", status: "200"},
		{path: "/panic-first", body: terminatedBody, status: "503", logsAPanic: true},
		{path: "/panic-midway", local: 503, body: "call-out failed", status: "11 reset", logsAPanic: true},
		{path: "/big", local: 503, body: "call-out failed", status: "11 reset"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			logs.Reset()
			r, err := run(t, h, "x-mode", "callout", "x-callout-path", tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(logs.String(), "panicked"); got != tt.logsAPanic {
				t.Errorf("panic logged = %v, want %v: %s", got, tt.logsAPanic, logs.String())
			}
			if tt.local != 0 {
				if r.Local == nil || r.Local.Status != tt.local || string(r.Local.Body) != tt.body {
					t.Fatalf("local = %+v, want %d %q", r.Local, tt.local, tt.body)
				}
				if got, _ := (Result{Headers: r.Local.Headers}).Get("x-callout-failure"); got != tt.status {
					t.Errorf("proxy_get_status = %q, want %q", got, tt.status)
				}
				return
			}
			if r.Local != nil {
				t.Fatalf("local = %+v (%s)", r.Local, r.Local.Body)
			}
			if got := mustGet(t, r, "x-callout-body"); got != tt.body {
				t.Errorf("x-callout-body = %q, want %q", got, tt.body)
			}
			if got := mustGet(t, r, "x-callout-status"); got != tt.status {
				t.Errorf("x-callout-status = %q, want %q", got, tt.status)
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
