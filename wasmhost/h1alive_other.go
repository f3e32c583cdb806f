//go:build !(linux || darwin || freebsd)

package wasmhost

import "net"

// aliveIdle cannot probe a connection here without reading from it; an
// idle connection the server closed fails the call-out that uses it.
func aliveIdle(net.Conn) bool { return true }
