// Command envoycheck validates an Envoy bootstrap for Sluice offline:
//
//	go run ./internal/envoycheck/cmd/envoycheck envoy.yaml
//
// It prints every problem found, one a line, and exits 1 when there is any.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/envoycheck"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: envoycheck envoy.yaml")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "envoycheck:", err)
		os.Exit(2)
	}
	if err := envoycheck.Check(data); err != nil {
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			for _, e := range joined.Unwrap() {
				fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], e)
			}
		} else {
			fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		}
		os.Exit(1)
	}
	fmt.Printf("%s: ok\n", os.Args[1])
}
