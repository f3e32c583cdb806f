// Package wasmbuild builds a Go package into a proxy-wasm module: `make
// wasm` (through internal/tools/buildwasm) and the tests that run a freshly
// built plugin or test guest build it the same way.
package wasmbuild
