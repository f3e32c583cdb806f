package main

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/hosttest"
	"github.com/sluicehq/sluice/wasmhost"
)

// guestWasm is the test guest (hosttest.Guest: a plugin whose x-mode
// header picks what a request does), built once per test process.
var guestWasm = sync.OnceValues(hosttest.Guest)

// guestConfig is a configuration the test guest accepts.
const guestConfig = "configuration"

func guest(t testing.TB) []byte {
	t.Helper()
	wasm, err := guestWasm()
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// guestHost runs the test guest on workers VMs until t ends.
func guestHost(t testing.TB, workers int) *wasmhost.Host {
	t.Helper()
	host, err := wasmhost.New(context.Background(), guest(t), wasmhost.Options{Workers: workers, PluginConfig: []byte(guestConfig), Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	return host
}

// guestFiles writes the test guest and a configuration it accepts into
// dir, for --plugin and --config.
func guestFiles(t testing.TB, dir string) (plugin, config string) {
	t.Helper()
	plugin, config = filepath.Join(dir, "guest.wasm"), filepath.Join(dir, "config")
	if err := os.WriteFile(plugin, guest(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte(guestConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return plugin, config
}
