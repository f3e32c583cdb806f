//go:build !linux

package proccpu

import (
	"errors"
	"time"
)

// WakeRoundTrip is measured on Linux only.
func WakeRoundTrip(n int, oneCPU bool) (wall, cpu time.Duration, err error) {
	return 0, 0, errors.New("proccpu: WakeRoundTrip is measured on Linux only")
}
