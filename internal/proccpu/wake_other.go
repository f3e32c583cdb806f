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

// WatchStalls is measured on Linux only.
func WatchStalls(span, over time.Duration) ([]Stalls, error) {
	return nil, errors.New("proccpu: WatchStalls is measured on Linux only")
}
