// Package idleconn tells whether an idle client connection is still open,
// for the clients that keep connections for reuse (the bridge's Redis
// connections, the wasm host's call-out connections): a peer, or something
// between, may have closed it while it sat idle.
package idleconn
