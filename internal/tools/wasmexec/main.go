// Command wasmexec runs a GOOS=wasip1 test binary on wazero, for go test's
// -exec flag:
//
//	go build -o build/wasmexec ./internal/tools/wasmexec
//	GOOS=wasip1 GOARCH=wasm go test -exec $PWD/build/wasmexec ./rules
//
// The rules package is linked into the plugin, and its tests and
// benchmarks run so as the plugin's code runs: compiled to WebAssembly,
// on the wazero compiler the gateway uses (its word-at-a-time loads and
// Go's wasm code generation are not what a native test sees). The binary
// gets its arguments, the environment, the clocks, and the host's files
// under the same paths, with the working directory of go test.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasmexec BINARY.wasm [ARGS...]")
		os.Exit(2)
	}
	code, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasmexec:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	ctx := context.Background()
	bin, err := os.ReadFile(args[0])
	if err != nil {
		return 0, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, r)
	// Go's wasip1 port resolves relative paths against $PWD.
	cfg := wazero.NewModuleConfig().WithArgs(args...).WithStdout(os.Stdout).WithStderr(os.Stderr).
		WithSysNanotime().WithSysWalltime().WithSysNanosleep().WithRandSource(rand.Reader).
		WithFSConfig(wazero.NewFSConfig().WithDirMount("/", "/")).WithEnv("PWD", wd)
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "PWD" {
			cfg = cfg.WithEnv(k, v)
		}
	}
	_, err = r.InstantiateWithConfig(ctx, bin, cfg)
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		return int(exit.ExitCode()), nil
	}
	return 0, err
}
