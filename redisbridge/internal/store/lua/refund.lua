-- Give back what check.lua consumed for a group of limits, when another
-- Redis Cluster slot of the same request denied (docs/bridge.md).
-- Arguments as script.go lays them out: ARGV[1] number of limits, then per
-- limit: alg, burst, cost. KEYS: counter keys.
-- Writes only to keys that still exist, so their expiry stays as check.lua set it.
local a = 2
for i = 1, tonumber(ARGV[1]) do
  local key, alg, burst, cost = KEYS[i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if alg == 1 then
    local tokens = redis.call('HGET', key, 'tokens')
    if tokens then
      redis.call('HSET', key, 'tokens', string.format('%.17g', math.min(burst, tonumber(tokens) + cost)))
    end
  elseif alg == 2 or alg == 4 then
    local c = redis.call('HGET', key, 'c')
    if c then redis.call('HSET', key, 'c', math.max(0, tonumber(c) - cost)) end
  elseif alg == 3 then
    redis.call('ZPOPMAX', key, cost)
  end
end
return 0
