// Package redisbridge is Sluice's check service. The proxy-wasm plugin
// sends it the limits that matched one HTTP request (rules wire format);
// the bridge decides them all-or-nothing against shared counters, in Redis
// (one script call deciding the checks that queued together, in arrival
// order, each all-or-nothing) or in memory.
//
// It also serves a REST API for services that ask it directly (a check per
// user and endpoint, batch check, status, per-user overrides, reset),
// Prometheus metrics and health checks. See docs/bridge.md for settings
// and docs/protocol.md for the wire format and the REST API.
//
// Its parts: one check core (check.go) that every transport calls
// (net/http here, the HTTP/1.1 fast path in internal/h1fast, the h2c one in
// internal/h2fast, through the contract of internal/checkio); the REST API
// (rest.go); overrides
// (internal/overrides), applied before the counter store
// (internal/store) decides; and, with --policy-store, the policy store
// in PostgreSQL (internal/policy, its API in policy.go): rules served to
// plugins, overrides and the audit trail.
package redisbridge
