package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/redisbridge"
	"github.com/sluicehq/sluice/wasmhost"
)

// BenchmarkGateway compares, over loopback TCP with keep-alive clients,
// the upstream alone, a plain httputil.ReverseProxy, the gateway without
// the plugin, and the gateway with the plugin on a request no limit
// matches and on one that makes a call-out (bridge on its embedded memory
// store). cpu-us/op is the whole process's CPU, load generator included.
func BenchmarkGateway(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "upstream")
	}))
	defer upstream.Close()
	up, _ := url.Parse(upstream.URL)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))

	set := redisbridge.DefaultSettings()
	set.Logger = logger
	set.AuditLog = b.TempDir() + "/audit.log"
	br, err := redisbridge.New(set)
	if err != nil {
		b.Fatal(err)
	}
	brLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go br.Serve(brLn) // the bridge's own listener: its HTTP/1.1 fast path
	defer br.Close()
	bridgeURL := "http://" + brLn.Addr().String()

	wasm, err := e2etest.BuildPlugin()
	if err != nil {
		b.Fatal(err)
	}
	const cfg = `{"bridge": {"cluster": "sluice_bridge", "timeout": "1s"},
	  "identity": {"sources": [{"type": "header", "header": "x-user-id"}], "client_ip": {"trusted_proxy_depth": 1}},
	  "rules": [{"name": "api", "match": {"paths": ["/api/**"]}, "limit": 1000000000, "window": "1h", "algorithm": "fixed_window"}]}`
	host, err := wasmhost.New(context.Background(), wasm, wasmhost.Options{
		Workers: 2, PluginConfig: []byte(cfg), RootID: "sluice", Logger: logger,
		Clusters: map[string]string{"sluice_bridge": bridgeURL},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()

	serve := func(h http.Handler) string {
		s := httptest.NewServer(h)
		b.Cleanup(s.Close)
		return s.URL
	}
	plain := &httputil.ReverseProxy{Transport: wasmhost.NewTransport(), Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up) }}
	cases := []struct{ name, base, path string }{
		{"a-upstream", upstream.URL, "/api/x"},
		{"b-reverse-proxy", serve(plain), "/api/x"},
		{"c-gateway-no-plugin", serve(newHandler(up, nil, logger, true, nil)), "/api/x"},
		{"d-gateway-no-match", serve(newHandler(up, host, logger, true, nil)), "/health"},
		{"e-gateway-call-out", serve(newHandler(up, host, logger, true, nil)), "/api/x"},
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DialContext: (&net.Dialer{}).DialContext}}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var users atomic.Int64
			b.SetParallelism(25) // 50 clients on 2 cores
			cpu := cpuNanos()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				user := "u" + string(rune('a'+users.Add(1)%26))
				for pb.Next() {
					req, _ := http.NewRequest("GET", c.base+c.path, nil)
					req.Header.Set("X-User-Id", user)
					res, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			b.ReportMetric(float64(cpuNanos()-cpu)/float64(b.N)/1e3, "cpu-us/op")
		})
	}
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
