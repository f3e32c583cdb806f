//go:build !wasip1

package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/wasmhost"
)

// TestWasm_PanicKeepsVMServing: a Go panic in the plugin's code, through
// the built module in the Envoy-faithful host, is logged with its stack at
// critical level, counted, answers its request by the failure mode, and
// leaves the VM serving (it does not trap). The panics come from the
// test-only trigger: VM env SLUICE_TEST_PANIC=1 plus a request header.
func TestWasm_PanicKeepsVMServing(t *testing.T) {
	for _, mode := range []string{"fail_open", "fail_closed"} {
		for _, where := range []string{"request", "callout"} {
			t.Run(mode+"/"+where, func(t *testing.T) {
				b := &fakeBridge{counts: map[string]int64{}}
				srv := httptest.NewServer(b)
				t.Cleanup(srv.Close)
				var (
					mu   sync.Mutex
					crit []string
				)
				cfg := strings.NewReplacer("%MODE%", mode, "%CLUSTER%", "bridge").Replace(wasmConfig)
				host, err := wasmhost.New(context.Background(), wasmBytes, wasmhost.Options{
					Workers: 1, PluginConfig: []byte(cfg), RootID: "sluice", Clusters: map[string]string{"bridge": srv.URL},
					Environment: map[string]string{"SLUICE_TEST_PANIC": "1"},
					OnLog: func(e wasmhost.LogEntry) {
						if e.Level == wasmhost.LogLevelCritical {
							mu.Lock()
							crit = append(crit, e.Message)
							mu.Unlock()
						}
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { host.Close() })
				h := &harness{t: t, host: host, bridge: b}

				o := h.do("/api/items", map[string]string{"x-user-id": "pat", "x-sluice-test-panic": where}, 200)
				if mode == "fail_open" && o.status != 200 {
					t.Errorf("fail_open: %+v, want the request to pass", o)
				}
				if mode == "fail_closed" && (o.status != 503 || !strings.Contains(o.body, "plugin error")) {
					t.Errorf("fail_closed: %+v, want 503", o)
				}
				if n := h.metric("sluice_panics_total"); n != 1 {
					t.Errorf("sluice_panics_total = %d, want 1", n)
				}
				callback := map[string]string{"request": "proxy_on_request_headers", "callout": "proxy_on_http_call_response"}[where]
				mu.Lock()
				logged := strings.Join(crit, "\n")
				mu.Unlock()
				if !strings.Contains(logged, "panic in "+callback+": sluice: test panic") || !strings.Contains(logged, "goroutine ") {
					t.Errorf("no critical log with the panic and its stack: %q", logged)
				}
				// The same VM serves the next request as usual.
				if o := h.do("/api/items", map[string]string{"x-user-id": "pat"}, 200); o.status != 200 || o.headers["x-ratelimit-limit"] != "3" {
					t.Errorf("next request: %+v", o)
				}
				if n := host.Failures(); n != 0 {
					t.Errorf("the VM failed %d times", n)
				}
			})
		}
	}
}
