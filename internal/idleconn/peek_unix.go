//go:build unix && !linux

package idleconn

import (
	"errors"
	"syscall"
)

// nothingToRead peeks at the socket without waiting and reports whether
// it had nothing to read.
func nothingToRead(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
}
