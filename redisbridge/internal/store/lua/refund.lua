-- Give back what check.lua consumed for a group of limits, when another
-- Redis Cluster slot of the same request denied (docs/bridge.md).
-- Arguments as script.go lays them out: ARGV[1] number of limits, then per
-- limit: alg, capacity (token bucket: burst; the others: limit), cost.
-- KEYS: counter keys.
-- Writes only to keys that still exist, so their expiry stays as check.lua set it.
-- Units come back only where they are the last the key counts: a fixed
-- window counting no later window, a sliding log with no member scored
-- after now (a throttle limit's reserved slots, or a lease's units, would
-- otherwise be taken back instead). Units not given back stay consumed,
-- which never lets more through.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local a = 2
for i = 1, tonumber(ARGV[1]) do
  local key, alg, cap, cost = KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if alg == 1 then
    local tokens = redis.call('HGET', key, 'tokens')
    if tokens then
      redis.call('HSET', key, 'tokens', string.format('%.17g', math.min(cap, tonumber(tokens) + cost)))
    end
  elseif alg == 2 or alg == 4 then
    local c = tonumber(redis.call('HGET', key, 'c'))
    if c and (alg == 2 or c <= cap) then redis.call('HSET', key, 'c', math.max(0, c - cost)) end
  elseif alg == 3 then
    local top = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    if top and top <= now then redis.call('ZPOPMAX', key, cost) end
  end
end
return 0
