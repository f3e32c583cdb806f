// Command buildwasm builds a Go package into a proxy-wasm module as the
// tests build it (internal/wasmbuild), for `make wasm`:
//
//	go run ./internal/tools/buildwasm -o build/plugin.wasm ./plugin
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/wasmbuild"
)

func main() {
	out := flag.String("o", "", "the module to write")
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: buildwasm -o out.wasm package")
		os.Exit(2)
	}
	if err := wasmbuild.Build(flag.Arg(0), *out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
