// Package e2e holds the end-to-end test suites of Sluice: the built plugin
// in the wasmhost proxy-wasm host, the real bridge and a real redis-server,
// with HTTP clients going through a gateway. The suites are test files
// only: fullstack_test.go here (the reference scenarios), distributed/
// (several hosts and bridges, Redis Cluster and Sentinel, faults) and
// hostile/ (hostile input, floods, fuzzing). e2etest holds what they share.
package e2e
