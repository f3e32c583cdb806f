// Package wasmbuild builds a Go package into a proxy-wasm module as
// `make wasm` does, for tests that run a freshly built plugin or test guest.
package wasmbuild
