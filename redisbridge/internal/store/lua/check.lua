-- Decide the limits of one HTTP request all-or-nothing (docs/protocol.md).
-- Mirrors memory.go line by line: same formulas, same rounding.
--
-- ARGV[1] mode: "c" decide and consume, "p" peek (no write at all)
-- ARGV[2] number of limits, then per limit:
--   alg (1 token_bucket, 2 sliding_window, 3 sliding_log, 4 fixed_window),
--   limit, window_ms, burst, cost, shadow (0/1),
--   penalty window_ms (0: no penalty) [, threshold, #multipliers, multipliers...]
-- KEYS: per limit its counter key, then with a penalty its ":v" and ":b" keys.
-- Returns {now_ms, allowed, per limit: allowed, limit, remaining, reset_ms, retry_after_ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

local L, a, k = {}, 3, 1
for i = 1, tonumber(ARGV[2]) do
  local l = {alg = tonumber(ARGV[a]), limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
    burst = tonumber(ARGV[a + 3]), cost = tonumber(ARGV[a + 4]), shadow = ARGV[a + 5] == '1',
    key = KEYS[k], retry = 0}
  l.cap = l.limit
  local pw = tonumber(ARGV[a + 6])
  a, k = a + 7, k + 1
  if pw > 0 then
    l.pw, l.threshold, l.mult = pw, tonumber(ARGV[a]), {}
    for j = 1, tonumber(ARGV[a + 1]) do l.mult[j] = tonumber(ARGV[a + 1 + j]) end
    a = a + 2 + #l.mult
    l.vkey, l.bkey = KEYS[k], KEYS[k + 1]
    k = k + 2
  end
  L[i] = l
end

-- Each algorithm sets ok, remaining, reset, retry and a write function.
local alg = {}

alg[1] = function(l) -- token bucket: HASH tokens, ts
  local cap, limit, W, cost = l.burst, l.limit, l.window, l.cost
  l.cap = cap
  local s = redis.call('HMGET', l.key, 'tokens', 'ts')
  local tokens = cap
  if s[1] then
    tokens = min(cap, tonumber(s[1]) + max(0, now - tonumber(s[2])) * limit / W)
  end
  l.ok = tokens >= cost
  local after = tokens
  if l.ok then after = tokens - cost end
  l.remaining = floor(after)
  l.reset = now + ceil((cap - after) * W / limit)
  if not l.ok then
    if cost > cap then l.retry = W else l.retry = ceil((cost - tokens) * W / limit) end
  end
  l.write = function()
    redis.call('HSET', l.key, 'tokens', string.format('%.17g', after), 'ts', now)
    redis.call('PEXPIRE', l.key, ceil(cap * W / limit) + 1000)
  end
end

alg[2] = function(l) -- sliding window, weighted: HASH w (window index), c (count), p (previous count)
  local limit, W, cost = l.limit, l.window, l.cost
  local idx = floor(now / W)
  local s = redis.call('HMGET', l.key, 'w', 'c', 'p')
  local cur, prev, w = 0, 0, tonumber(s[1])
  if w == idx then cur, prev = tonumber(s[2]), tonumber(s[3])
  elseif w == idx - 1 then prev = tonumber(s[2]) end
  local elapsed = now - idx * W
  local est = prev * ((W - elapsed) / W) + cur
  l.ok = est + cost <= limit
  local after, rem = cur, limit - est
  if l.ok then after, rem = cur + cost, rem - cost end
  l.remaining = max(0, floor(rem))
  if after > 0 then l.reset = (idx + 2) * W
  elseif prev > 0 then l.reset = (idx + 1) * W
  else l.reset = now end
  if not l.ok then
    if cost > limit then l.retry = W
    else
      local room = limit - cost - cur
      if room >= 0 then
        l.retry = ceil(W - room * W / prev - elapsed)
      else
        l.retry = (idx + 1) * W - now + ceil(W - (limit - cost) * W / cur)
      end
      l.retry = max(1, l.retry)
    end
  end
  l.write = function()
    redis.call('HSET', l.key, 'w', idx, 'c', after, 'p', prev)
    redis.call('PEXPIRE', l.key, 2 * W + 1000)
  end
end

alg[3] = function(l) -- sliding log: ZSET of admitted units, score = ms
  local limit, W, cost = l.limit, l.window, l.cost
  local from = '(' .. string.format('%d', now - W)
  local count = redis.call('ZCOUNT', l.key, from, '+inf')
  l.ok = count + cost <= limit
  local after = count
  if l.ok then after = count + cost end
  l.remaining = limit - after
  if after == 0 then l.reset = now
  elseif l.ok and cost > 0 then l.reset = now + W
  else l.reset = tonumber(redis.call('ZRANGE', l.key, -1, -1, 'WITHSCORES')[2]) + W end
  if not l.ok then
    if cost > limit then l.retry = W
    else
      local r = redis.call('ZRANGEBYSCORE', l.key, from, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
      l.retry = max(1, tonumber(r[2]) + W - now)
    end
  end
  l.write = function()
    redis.call('ZREMRANGEBYSCORE', l.key, '-inf', string.format('%d', now - W))
    for j = 1, cost do
      -- Unique per ms: within one ms the in-window count only grows.
      redis.call('ZADD', l.key, now, string.format('%d-%06d', now, count + j))
    end
    redis.call('PEXPIRE', l.key, W)
  end
end

alg[4] = function(l) -- fixed window: HASH w (window index), c (count)
  local limit, W, cost = l.limit, l.window, l.cost
  local idx = floor(now / W)
  local s = redis.call('HMGET', l.key, 'w', 'c')
  local cur = 0
  if tonumber(s[1]) == idx then cur = tonumber(s[2]) end
  l.ok = cur + cost <= limit
  local after = cur
  if l.ok then after = cur + cost end
  l.remaining = limit - after
  if after > 0 then l.reset = (idx + 1) * W else l.reset = now end
  if not l.ok then
    if cost > limit then l.retry = W else l.retry = (idx + 1) * W - now end
  end
  l.write = function()
    redis.call('HSET', l.key, 'w', idx, 'c', after)
    redis.call('PEXPIRE', l.key, (idx + 1) * W - now + 1000)
  end
end

-- violate records a violation and blocks the limit once there are enough.
local function violate(l)
  redis.call('ZREMRANGEBYSCORE', l.vkey, '-inf', string.format('%d', now - l.pw))
  local n = redis.call('ZCARD', l.vkey) + 1
  redis.call('ZADD', l.vkey, now, string.format('%d-%06d', now, n))
  redis.call('ZREMRANGEBYRANK', l.vkey, 0, -1001)
  redis.call('PEXPIRE', l.vkey, l.pw)
  n = min(n, 1000)
  if n >= l.threshold then
    local block = l.window * l.mult[min(n - l.threshold, #l.mult - 1) + 1]
    redis.call('SET', l.bkey, string.format('%d', now + block), 'PX', string.format('%d', block))
    l.retry, l.reset = max(l.retry, block), max(l.reset, now + block)
  end
end

local allowed = true
for i = 1, #L do
  local l = L[i]
  alg[l.alg](l)
  if l.bkey then
    local b = tonumber(redis.call('GET', l.bkey))
    if b and b > now then
      l.ok, l.blocked, l.remaining, l.retry, l.reset = false, true, 0, b - now, max(l.reset, b)
    end
  end
  if not l.ok and not l.shadow then allowed = false end
end

if ARGV[1] == 'c' then
  for i = 1, #L do
    local l = L[i]
    if allowed then
      if l.ok then l.write() end
    elseif not l.ok and not l.shadow and l.vkey and not l.blocked then
      violate(l)
    end
  end
end

local out, o = {now, allowed and 1 or 0}, 3
for i = 1, #L do
  local l = L[i]
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = l.ok and 1 or 0, l.cap, l.remaining, l.reset, l.retry
  o = o + 5
end
return out
