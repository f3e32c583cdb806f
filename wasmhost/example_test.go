package wasmhost_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice/internal/hosttest"
	"github.com/sluicehq/sluice/wasmhost"
)

// A Go gateway puts a proxy-wasm plugin in front of its handler: every
// request goes through the plugin as through Envoy's HTTP filter chain.
// Here the plugin is the host's test guest, which answers requests with the
// header x-mode: deny itself and lets the others through; a real gateway
// loads build/plugin.wasm with its JSON configuration and names the
// bridge's cluster (cmd/gateway does).
func ExampleHost_Middleware() {
	wasm, err := hosttest.Guest()
	if err != nil {
		log.Fatal(err)
	}
	host, err := wasmhost.New(context.Background(), wasm, wasmhost.Options{
		Workers:       2,
		PluginConfig:  []byte("configuration"),
		FailurePolicy: wasmhost.FailReload,
		Clusters:      map[string]string{"sluice_bridge": "http://127.0.0.1:8081"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()

	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	srv := httptest.NewServer(host.Middleware(app))
	defer srv.Close()

	for _, mode := range []string{"none", "deny"} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/items", nil)
		req.Header.Set("X-Mode", mode)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("Retry-After"), string(body))
	}
	// Output:
	// 200  hello
	// 429 7 denied
}

// A gateway serves the plugin's metrics for Prometheus to scrape, named
// and shaped as Envoy's /stats/prometheus exports them, so the same
// dashboards and alerts read both (cmd/gateway serves them on
// --admin-listen). Here the test guest, for each request in its echo mode,
// counts it, sets a gauge and records 7 in a histogram; a few of the
// lines are printed.
func ExampleHost_WritePrometheus() {
	wasm, err := hosttest.Guest()
	if err != nil {
		log.Fatal(err)
	}
	host, err := wasmhost.New(context.Background(), wasm, wasmhost.Options{Workers: 2, PluginConfig: []byte("configuration")})
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()
	srv := httptest.NewServer(host.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Mode", "echo")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
	}

	var out strings.Builder
	if err := host.WritePrometheus(&out); err != nil {
		log.Fatal(err)
	}
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "test_requests") || strings.HasPrefix(line, "test_gauge") ||
			strings.HasPrefix(line, "# TYPE test_hist") || strings.Contains(line, `le="5"`) || strings.Contains(line, `le="10"`) ||
			strings.HasPrefix(line, "test_hist_sum") || strings.HasPrefix(line, "test_hist_count") {
			fmt.Print(line)
		}
	}
	// Output:
	// test_gauge 42
	// # TYPE test_hist histogram
	// test_hist_bucket{le="5"} 0
	// test_hist_bucket{le="10"} 3
	// test_hist_sum 21
	// test_hist_count 3
	// test_requests 3
}

// A service the gateway embeds answers the plugin's call-outs in process:
// the cluster's handler serves each call-out as a server would, without a
// connection (cmd/gateway's --embed-bridge serves the bridge this way).
// Here the test guest calls out to the cluster "backend" on every request
// in its callout mode and hands the answer to the application in request
// headers.
func ExampleOptions_handlers() {
	wasm, err := hosttest.Guest()
	if err != nil {
		log.Fatal(err)
	}
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "checked "+r.URL.Path)
	})
	host, err := wasmhost.New(context.Background(), wasm, wasmhost.Options{
		PluginConfig: []byte("configuration"),
		Handlers:     map[string]http.Handler{"backend": backend},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Header.Get("X-Callout-Status"), r.Header.Get("X-Callout-Body"))
	})
	srv := httptest.NewServer(host.Middleware(app))
	defer srv.Close()

	req, _ := http.NewRequest("GET", srv.URL+"/api/items", nil)
	req.Header.Set("X-Mode", "callout")
	req.Header.Set("X-Callout-Path", "/check/1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(res.StatusCode, string(body))
	// Output:
	// 200 202 checked /check/1
}

// A Go gateway answers its clients as Envoy's router does when its own
// upstream fails: here the upstream's port is closed, so the client gets
// Envoy's 503, and the access log would show the flag UF.
func ExampleUpstreamFailure() {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // nothing listens there now
	up, _ := url.Parse(gone.URL)
	proxy := httputil.NewSingleHostReverseProxy(up)
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		reply, flag := wasmhost.UpstreamFailure(err, false)
		fmt.Println("flag:", flag)
		wasmhost.WriteLocalResponse(w, r, &reply)
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()

	res, err := http.Get(srv.URL)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(res.StatusCode, string(body))
	// Output:
	// flag: UF
	// 503 upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: 111
}
