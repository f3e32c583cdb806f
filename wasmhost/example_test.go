package wasmhost_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

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
