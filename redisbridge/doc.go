// Package redisbridge is Sluice's check service. The proxy-wasm plugin
// sends it the limits that matched one HTTP request (rules wire format);
// the bridge decides them all-or-nothing against shared counters, in Redis
// (one EVALSHA per check, pipelined across concurrent checks) or in memory.
//
// It also serves the internal REST API of the seed design (batch check,
// status, per-user overrides, reset), Prometheus metrics and health checks.
// See docs/bridge.md for settings and docs/protocol.md for the wire format.
package redisbridge
