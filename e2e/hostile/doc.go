// Package hostile feeds the built plugin, in the wasmhost host with two worker
// VMs behind a gateway and a real bridge, input an attacker chooses: huge
// and numerous headers, malformed X-Forwarded-For, invalid UTF-8, control
// bytes, forged JWTs, odd paths and methods, and floods of distinct client
// ids. Every request must get a decision (or the configured failure mode),
// the limit must land on the identity docs/config.md promises, the plugin
// must never trap, and its memory and shared data must stay bounded.
// Figures are logged with t.Logf and summarised in docs/reliability.md.
package hostile
