//go:build !unix

package idleconn

import "net"

// Alive cannot look at the socket here without reading from it: a dead
// connection fails its next use instead.
func Alive(net.Conn) bool { return true }
