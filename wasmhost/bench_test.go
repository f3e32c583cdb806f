package wasmhost

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/internal/hosttest"
	"github.com/sluicehq/sluice/internal/inproc"
)

var benchHeaders = [][2]string{
	{"user-agent", "bench"}, {"accept", "*/*"}, {"x-user", "alice"}, {"authorization", "Bearer x"},
}

// BenchmarkHost_Stream is the host overhead per request with a trivial guest
// callback: context create, request headers, response headers, done, log,
// delete.
func BenchmarkHost_Stream(b *testing.B) {
	for _, mode := range []string{"", "hot"} {
		name := "trivial"
		if mode != "" {
			name = mode
		}
		b.Run(name, func(b *testing.B) {
			h := newHost(b, Options{Workers: 1})
			hdrs := benchHeaders
			if mode != "" {
				hdrs = append([][2]string{{"x-mode", mode}}, hdrs...)
			}
			info := RequestInfo{Method: "GET", Path: "/api/v1/items", Host: "example.com",
				Headers: hdrs, SourceAddress: "10.0.0.1:1234", EndOfStream: true}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s := h.NewStream(ctx, info)
				if _, err := s.RequestHeaders(ctx); err != nil {
					b.Fatal(err)
				}
				if _, err := s.ResponseHeaders(ctx, 200, nil); err != nil {
					b.Fatal(err)
				}
				s.Close()
			}
		})
	}
}

// BenchmarkHost_StreamParallel spreads requests over four VMs.
func BenchmarkHost_StreamParallel(b *testing.B) {
	h := newHost(b, Options{Workers: 4})
	info := RequestInfo{Method: "GET", Path: "/", Host: "h", Headers: benchHeaders, SourceAddress: "10.0.0.1:1"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			s := h.NewStream(ctx, info)
			if _, err := s.RequestHeaders(ctx); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}

// BenchmarkHost_Middleware is a request through net/http's handler path
// (no network) with the plugin in front.
func BenchmarkHost_Middleware(b *testing.B) {
	h := newHost(b, Options{Workers: 1})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mw := h.Middleware(next)
	req := httptest.NewRequest("GET", "/api/v1/items", nil)
	req.Header.Set("X-User", "alice")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mw.ServeHTTP(httptest.NewRecorder(), req.Clone(context.Background()))
	}
}

// BenchmarkHost_Callout is a request paused for a call-out to an upstream
// on this machine, over TCP loopback and over a Unix socket, or in process
// to its handler through net/http's request and response or as an
// inproc.Server, and resumed from the root context.
func BenchmarkHost_Callout(b *testing.B) {
	srv := hosttest.Backend(b)
	for _, tc := range []struct {
		name    string
		cluster string       // "": in process (Options.Handlers)
		handler http.Handler // in process
	}{{"tcp", srv.URL, nil}, {"unix", unixClusters(b, srv.Config.Handler)["backend"], nil},
		{"in-process", "", srv.Config.Handler}, {"in-process-server", "", backendServer{}}} {
		b.Run(tc.name, func(b *testing.B) {
			opts := Options{Workers: 1, Clusters: map[string]string{"backend": tc.cluster}}
			if tc.cluster == "" {
				opts = Options{Workers: 1, Handlers: map[string]http.Handler{"backend": tc.handler}}
			}
			h := newHost(b, opts)
			info := RequestInfo{Method: "GET", Path: "/", Headers: [][2]string{{"x-mode", "callout"}, {"x-callout-path", "/b"}}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				s := h.NewStream(ctx, info)
				r, err := s.RequestHeaders(ctx)
				if err != nil || r.Local != nil {
					b.Fatal(err, r.Local)
				}
				s.Close()
			}
		})
	}
}

// backendServer answers as hosttest.Backend does a path of its own (202,
// X-Upstream, the path), as an inproc.Server.
type backendServer struct{ http.Handler }

func (backendServer) Serves(method, path []byte) bool { return true }

func (backendServer) ServeCallout(ctx context.Context, req *inproc.Request, res *inproc.Response) {
	res.Status = http.StatusAccepted
	res.Set("X-Upstream", []byte("yes"))
	res.Body = append(res.Body, calloutPath(req)...)
}
