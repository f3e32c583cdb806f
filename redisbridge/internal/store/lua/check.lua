-- Decide the limits of one HTTP request all-or-nothing (docs/protocol.md).
-- Mirrors memory.go line by line: same formulas, same rounding.
-- Arguments and reply are laid out in script.go:
--
-- ARGV[1] mode: "c" decide and consume, "p" peek (no write at all)
-- ARGV[2] violations kept per key at most
-- ARGV[3] number of limits, then per limit:
--   alg (1 token_bucket, 2 sliding_window, 3 sliding_log, 4 fixed_window),
--   limit, window_ms, burst, cost, log_only (0/1),
--   penalty window_ms (0: no penalty) [, threshold, #multipliers, multipliers...]
-- KEYS: per limit its counter key, then with a penalty its ":v" and ":b" keys.
-- Returns {now_ms, allowed, per limit: allowed, limit, remaining, reset_ms, retry_after_ms}.
--
-- This runs in Redis's only thread for every request, so it is written for
-- speed: no closures or function tables built per call, each limit's table
-- built with the fields every limit gets (each field added later may make
-- Lua rehash the table), and the answer of a one-limit check built at once.
local call, tonumber, format = redis.call, tonumber, string.format
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)

local vcap = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local L, a, k = {}, 4, 1
for i = 1, n do
  local l = {alg = tonumber(ARGV[a]), limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
    burst = tonumber(ARGV[a + 3]), cost = tonumber(ARGV[a + 4]), logOnly = ARGV[a + 5] == '1',
    key = KEYS[k], retry = 0, cap = 0, ok = false, remaining = 0, reset = 0, after = 0, idx = 0, prev = 0}
  l.cap = l.limit
  local pw = tonumber(ARGV[a + 6])
  a, k = a + 7, k + 1
  if pw > 0 then
    local mult = {}
    for j = 1, tonumber(ARGV[a + 1]) do mult[j] = tonumber(ARGV[a + 1 + j]) end
    l.pw, l.threshold, l.mult = pw, tonumber(ARGV[a]), mult
    a = a + 2 + #mult
    l.vkey, l.bkey = KEYS[k], KEYS[k + 1]
    k = k + 2
  end
  L[i] = l
end

-- Decide each limit without writing: ok, remaining, reset, retry, and what
-- the write below needs (after, idx, prev, count).
local allowed = true
for i = 1, n do
  local l = L[i]
  local alg, limit, W, cost = l.alg, l.limit, l.window, l.cost
  if alg == 1 then -- token bucket: HASH tokens, ts
    local cap = l.burst
    l.cap = cap
    local s = call('HMGET', l.key, 'tokens', 'ts')
    local tokens = cap
    if s[1] then
      tokens = min(cap, tonumber(s[1]) + max(0, now - tonumber(s[2])) * limit / W)
    end
    l.ok = tokens >= cost
    local after = tokens
    if l.ok then after = tokens - cost end
    l.after = after
    l.remaining = floor(after)
    l.reset = now + ceil((cap - after) * W / limit)
    if not l.ok then
      if cost > cap then l.retry = W else l.retry = ceil((cost - tokens) * W / limit) end
    end
  elseif alg == 2 then -- sliding window, weighted: HASH w (window index), c (count), p (previous count)
    local idx = floor(now / W)
    local s = call('HMGET', l.key, 'w', 'c', 'p')
    local cur, prev, w = 0, 0, tonumber(s[1])
    if w == idx then cur, prev = tonumber(s[2]), tonumber(s[3])
    elseif w == idx - 1 then prev = tonumber(s[2]) end
    local elapsed = now - idx * W
    local est = prev * ((W - elapsed) / W) + cur
    l.ok = est + cost <= limit
    local after, rem = cur, limit - est
    if l.ok then after, rem = cur + cost, rem - cost end
    l.idx, l.after, l.prev = idx, after, prev
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
  elseif alg == 3 then -- sliding log: ZSET of admitted units, score = ms
    local from = '(' .. format('%d', now - W)
    local count = call('ZCOUNT', l.key, from, '+inf')
    l.ok = count + cost <= limit
    local after = count
    if l.ok then after = count + cost end
    l.count = count
    l.remaining = limit - after
    if after == 0 then l.reset = now
    elseif l.ok and cost > 0 then l.reset = now + W
    else l.reset = tonumber(call('ZRANGE', l.key, -1, -1, 'WITHSCORES')[2]) + W end
    if not l.ok then
      if cost > limit then l.retry = W
      else
        local r = call('ZRANGEBYSCORE', l.key, from, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
        l.retry = max(1, tonumber(r[2]) + W - now)
      end
    end
  else -- fixed window: HASH w (window index), c (count)
    local idx = floor(now / W)
    local s = call('HMGET', l.key, 'w', 'c')
    local cur = 0
    if tonumber(s[1]) == idx then cur = tonumber(s[2]) end
    l.ok = cur + cost <= limit
    local after = cur
    if l.ok then after = cur + cost end
    l.idx, l.after = idx, after
    l.remaining = limit - after
    if after > 0 then l.reset = (idx + 1) * W else l.reset = now end
    if not l.ok then
      if cost > limit then l.retry = W else l.retry = (idx + 1) * W - now end
    end
  end
  if l.bkey then
    local b = tonumber(call('GET', l.bkey))
    if b and b > now then
      l.ok, l.blocked, l.remaining, l.retry, l.reset = false, true, 0, b - now, max(l.reset, b)
    end
  end
  if not l.ok and not l.logOnly then allowed = false end
end

if ARGV[1] == 'c' then
  for i = 1, n do
    local l = L[i]
    if allowed then
      if l.ok then
        local alg, key, W = l.alg, l.key, l.window
        if alg == 1 then
          call('HSET', key, 'tokens', format('%.17g', l.after), 'ts', now)
          call('PEXPIRE', key, ceil(l.cap * W / l.limit) + 1000)
        elseif alg == 2 then
          call('HSET', key, 'w', l.idx, 'c', l.after, 'p', l.prev)
          call('PEXPIRE', key, 2 * W + 1000)
        elseif alg == 3 then
          call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - W))
          -- Unique per ms: within one ms the in-window count only grows.
          -- A key listed twice in one check is written twice (each limit
          -- adds its cost, as in memory.go): the limit's index keeps the
          -- second's members apart from the first's.
          local tag = ''
          if i > 1 then tag = '.' .. i end
          for j = 1, l.cost do
            call('ZADD', key, now, format('%d-%06d', now, l.count + j) .. tag)
          end
          call('PEXPIRE', key, W)
        else
          call('HSET', key, 'w', l.idx, 'c', l.after)
          call('PEXPIRE', key, (l.idx + 1) * W - now + 1000)
        end
      end
    elseif not l.ok and not l.logOnly and l.vkey and not l.blocked then
      -- A violation; enough of them in the detection window block the limit.
      call('ZREMRANGEBYSCORE', l.vkey, '-inf', format('%d', now - l.pw))
      local v = call('ZCARD', l.vkey) + 1
      call('ZADD', l.vkey, now, format('%d-%06d', now, v))
      call('ZREMRANGEBYRANK', l.vkey, 0, -vcap - 1)
      call('PEXPIRE', l.vkey, l.pw)
      v = min(v, vcap)
      if v >= l.threshold then
        local block = l.window * l.mult[min(v - l.threshold, #l.mult - 1) + 1]
        call('SET', l.bkey, format('%d', now + block), 'PX', format('%d', block))
        l.retry, l.reset = max(l.retry, block), max(l.reset, now + block)
      end
    end
  end
end

local r = allowed and 1 or 0
if n == 1 then
  local l = L[1]
  return {now, r, l.ok and 1 or 0, l.cap, l.remaining, l.reset, l.retry}
end
local out, o = {now, r}, 3
for i = 1, n do
  local l = L[i]
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = l.ok and 1 or 0, l.cap, l.remaining, l.reset, l.retry
  o = o + 5
end
return out
