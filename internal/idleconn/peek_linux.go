package idleconn

import (
	"syscall"
	"unsafe"
)

// nothingToRead peeks at the socket without waiting and reports whether
// it had nothing to read. A raw system call: the peek never blocks, and
// a pool probes before every exchange, where the runtime's bookkeeping
// for a call that may block costs more than the peek (internal/rawsock).
func nothingToRead(fd uintptr) bool {
	var b [1]byte
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return e == syscall.EAGAIN
}
