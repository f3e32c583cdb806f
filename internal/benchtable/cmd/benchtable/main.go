// Command benchtable prints the table of the rows benchmarks appended to
// a file (benchtable.Env): `go run ./internal/benchtable/cmd/benchtable FILE`.
package main

import (
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/benchtable"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtable FILE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	rows, err := benchtable.Read(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	benchtable.Print(os.Stdout, rows)
}
