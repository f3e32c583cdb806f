//go:build !linux

package loadgen

import (
	"context"
	"errors"
)

// runH1 needs epoll (h1_linux.go).
func runH1(context.Context, Options) (Result, error) {
	return Result{}, errors.New("loadgen: HTTP/1.1 runs on Linux only")
}
