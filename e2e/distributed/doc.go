// Package distributed tests Sluice spread out and under faults: several
// bridge replicas and plugin VMs deciding one key together on single Redis,
// Redis Cluster and Sentinel, and what clients see while Redis, the bridge
// or the network between plugin and bridge fail. Everything runs on
// loopback: redis-server processes started by the tests, bridges in
// process, the plugin in the wasmhost wazero host. Figures are logged with
// t.Logf and summarised in docs/reliability.md.
package distributed
