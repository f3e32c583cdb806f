package wasmhost

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/hosttest"
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
