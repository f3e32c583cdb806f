// Package unixaddr is the one way Sluice names a Unix socket where an
// address or URL goes: "unix:///run/sluice/bridge.sock", for the bridge's
// --listen and for call-out clusters (the gateway's --cluster,
// wasmhost.Options.Clusters).
package unixaddr

import (
	"fmt"
	"strings"
)

// Scheme starts an address that is a Unix socket.
const Scheme = "unix://"

// Path returns the socket's path when addr names a Unix socket with an
// absolute path.
func Path(addr string) (string, bool) {
	if p, ok := strings.CutPrefix(addr, Scheme); ok && strings.HasPrefix(p, "/") {
		return p, true
	}
	return "", false
}

// Check refuses an address that starts with Scheme but has no absolute
// path (unix://bridge.sock); any other address passes.
func Check(addr string) error {
	if strings.HasPrefix(addr, Scheme) {
		if _, ok := Path(addr); !ok {
			return fmt.Errorf("%q: a Unix socket needs an absolute path, unix:///run/sluice/bridge.sock", addr)
		}
	}
	return nil
}
