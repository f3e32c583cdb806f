#!/usr/bin/env bash
# make run: start the bridge, a demo upstream and the gateway with
# examples/config.json, show a 200, a 429 and throttled requests, and keep
# serving until Ctrl-C.
# The bridge uses its embedded memory store, or Redis when REDIS_URL is set.
# EMBED_BRIDGE=1 runs it inside the gateway (--embed-bridge) instead of as a
# process of its own.
# The gateway strips x-user-id and x-tier: examples/config.json trusts them as
# set by an authenticating layer, which this demo does not have.
set -euo pipefail
cd "$(dirname "$0")/.."

BRIDGE_ADDR=${BRIDGE_ADDR:-127.0.0.1:8081}
UPSTREAM_ADDR=${UPSTREAM_ADDR:-127.0.0.1:9000}
GATEWAY_ADDR=${GATEWAY_ADDR:-127.0.0.1:8080}
ADMIN_ADDR=${ADMIN_ADDR:-127.0.0.1:9901}
LOGS=${LOGS:-build/run}
mkdir -p "$LOGS"

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo; echo "stopping everything make run started"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

wait_http() { # url name logfile
  for _ in $(seq 1 100); do
    if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$2 did not come up; its log ($3):"; tail -20 "$3"; exit 1
}

store_args=(--store memory)
if [[ -n "${REDIS_URL:-}" ]]; then store_args=(--store redis --redis-url "$REDIS_URL"); fi
bridge_args=(--cluster "sluice_bridge=http://$BRIDGE_ADDR")
bridge_where="http://$BRIDGE_ADDR    (metrics at /metrics)"
if [[ "${EMBED_BRIDGE:-}" == 1 ]]; then
  # The embedded bridge reads the bridge's SLUICE_* settings.
  export SLUICE_STORE=memory
  if [[ -n "${REDIS_URL:-}" ]]; then export SLUICE_STORE=redis SLUICE_REDIS_URL="$REDIS_URL"; fi
  bridge_args=(--embed-bridge sluice_bridge)
  bridge_where="in the gateway's process (its API and /metrics on http://$ADMIN_ADDR)"
else
  build/redisbridge --listen "$BRIDGE_ADDR" "${store_args[@]}" >"$LOGS/bridge.log" 2>&1 &
  pids+=($!)
fi
build/demo-upstream --listen "$UPSTREAM_ADDR" >"$LOGS/upstream.log" 2>&1 &
pids+=($!)
if [[ "${EMBED_BRIDGE:-}" != 1 ]]; then wait_http "http://$BRIDGE_ADDR/healthz" bridge "$LOGS/bridge.log"; fi
wait_http "http://$UPSTREAM_ADDR/" upstream "$LOGS/upstream.log"
build/gateway --listen "$GATEWAY_ADDR" --plugin build/plugin.wasm --config examples/config.json \
  --upstream "http://$UPSTREAM_ADDR" "${bridge_args[@]}" --workers 2 \
  --strip-header x-user-id --strip-header x-tier --compile-cache build/wazero-cache \
  --admin-listen "$ADMIN_ADDR" --access-log "$LOGS/access.log" >"$LOGS/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -s -o /dev/null "http://$GATEWAY_ADDR/" && break; sleep 0.1; done

cat <<MSG

Sluice is running (store: ${store_args[*]}):
  gateway   http://$GATEWAY_ADDR   (plugin build/plugin.wasm, config examples/config.json)
            http://$ADMIN_ADDR   (its admin address: the plugin's metrics at /stats/prometheus, /ready)
  bridge    $bridge_where
  upstream  http://$UPSTREAM_ADDR
  logs      $LOGS/   (the gateway's access log, in Envoy's format: $LOGS/access.log)

A request passes, with its rate limit headers (auth category: 5 per minute per IP):
  curl -i http://$GATEWAY_ADDR/api/v1/login
MSG
curl -s -i "http://$GATEWAY_ADDR/api/v1/login" | sed 's/^/  | /'
echo
echo "Four more use up the quota; the next request within the minute is refused with 429 and Retry-After:"
echo "  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' http://$GATEWAY_ADDR/api/v1/login; done"
echo "  curl -i http://$GATEWAY_ADDR/api/v1/login"
for _ in 1 2 3 4; do curl -s -o /dev/null "http://$GATEWAY_ADDR/api/v1/login"; done
curl -s -i "http://$GATEWAY_ADDR/api/v1/login" | sed 's/^/  | /'
echo
echo "A throttled endpoint (webhooks: 2 per second per IP) holds requests instead of refusing them:"
echo "of four at once, two pass now and two a second later (their X-RateLimit-Delay header says how long):"
echo "  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code} after %{time_total}s\n' http://$GATEWAY_ADDR/api/v1/webhooks/in & done; wait"
curls=()
for _ in 1 2 3 4; do
  curl -s -o /dev/null -w '  | %{http_code} after %{time_total}s\n' "http://$GATEWAY_ADDR/api/v1/webhooks/in" &
  curls+=($!)
done
wait "${curls[@]}"
echo
echo "The plugin's counters, as Prometheus scrapes them from the gateway (and from Envoy's admin address):"
echo "  curl -s http://$ADMIN_ADDR/stats/prometheus | grep -E '^sluice_(requests|allowed|denied|throttled)_total'"
curl -s "http://$ADMIN_ADDR/stats/prometheus" | grep -E '^sluice_(requests|allowed|denied|throttled)_total' | sed 's/^/  | /'
echo
echo "The last requests in the gateway's access log (Envoy's format; lines reach the file within a second):"
echo "  tail -3 $LOGS/access.log"
sleep 1.1
tail -3 "$LOGS/access.log" | sed 's/^/  | /'
echo
echo "Press Ctrl-C to stop."
wait
