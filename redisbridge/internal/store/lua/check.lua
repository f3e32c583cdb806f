-- Decide a batch of checks, one after the other in the order given, each
-- check's limits all-or-nothing (docs/protocol.md). A check sees what the
-- checks before it in the batch wrote, exactly as if each were its own
-- script call; all of them share one Redis TIME.
-- Mirrors memory.go line by line: same formulas, same rounding.
-- Arguments and reply are laid out in script.go:
--
-- ARGV[1] violations kept per key at most
-- ARGV[2] number of specs, then per spec (what limits share, sent once):
--   alg (1 token_bucket, 2 sliding_window, 3 sliding_log, 4 fixed_window),
--   limit, window_ms, burst, cost, log_only (0/1),
--   penalty window_ms (0: no penalty) [, threshold, #multipliers, multipliers...]
-- then the number of checks, then per check: its number of limits
--   (negative: a peek, which writes nothing), then per limit its spec's number.
-- KEYS: per check, per limit its counter key, then with a penalty its ":v" and ":b" keys.
-- Returns {now_ms, per check: allowed (0/1, or the error of a check that
-- failed, as text), then per limit: allowed, limit, remaining, reset_ms, retry_after_ms}.
--
-- This runs in Redis's only thread for every request, so it is written for
-- speed: each spec parsed once per call, no closures or tables built per
-- check (a check of one limit, the usual, keeps its state in locals; the
-- limit tables of longer checks are reused from one check to the next),
-- and every HASH counter read and written once per call (below).
local call, tonumber, format, pcall, type, tostring = redis.call, tonumber, string.format, pcall, type, tostring
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local stamp = t[1] .. format('%06d', tonumber(t[2])) -- TIME in us: the members this call adds
-- Integers go to Redis formatted with %d: a Lua number Redis converts
-- itself is printed as a float, several times slower.
local nowStr = format('%d', now)

local vcap = tonumber(ARGV[1])

-- The HASH counters (token bucket, sliding window, fixed window) a batch
-- touches are read once and written once: cache[key] holds the key's
-- fields as HMGET read them and as the checks since wrote them; the keys
-- written are listed in dirty and written back, fields and expiry as the
-- last check left them, once the batch is decided. So a key that many
-- checks of a batch share (a hot key) costs one read and one write per
-- batch. No time passes and no key expires within a script, so the cached
-- fields are what Redis would hold.
local cache, dirty, nd = {}, {}, 0
local seq = 0 -- members added by this call (sliding logs, violations)

-- decideLimit decides one limit without writing. It returns ok, remaining,
-- reset, retry, cap (the limit reported), and the state to write when the
-- check is allowed: after, idx, prev (sliding window), count (sliding
-- log). One function for the four algorithms: a script call builds each
-- of its functions anew, which a batch of one check notices.
local function decideLimit(alg, key, limit, W, cap, cost)
  local s
  if alg ~= 3 then
    s = cache[key]
    if not s then
      if alg == 2 then s = call('HMGET', key, 'w', 'c', 'p')
      elseif alg == 1 then s = call('HMGET', key, 'tokens', 'ts')
      else s = call('HMGET', key, 'w', 'c') end
      s[4], s[5] = alg, false -- the algorithm; the expiry in ms, once written
      cache[key] = s
    end
  end
  if alg == 1 then -- token bucket: HASH tokens, ts
    local tokens = cap
    if s[1] then
      tokens = min(cap, tonumber(s[1]) + max(0, now - tonumber(s[2])) * limit / W)
    end
    local ok = tokens >= cost
    local after, retry = tokens, 0
    if ok then after = tokens - cost
    elseif cost > cap then retry = W
    else retry = ceil((cost - tokens) * W / limit) end
    return ok, floor(after), now + ceil((cap - after) * W / limit), retry, cap, after, 0, 0, 0
  elseif alg == 2 then -- sliding window, weighted: HASH w (window index), c (count), p (previous count)
    local idx = floor(now / W)
    local cur, prev, w = 0, 0, tonumber(s[1])
    if w == idx then cur, prev = tonumber(s[2]), tonumber(s[3])
    elseif w == idx - 1 then prev = tonumber(s[2]) end
    local elapsed = now - idx * W
    local est = prev * ((W - elapsed) / W) + cur
    local ok = est + cost <= limit
    local after, rem = cur, limit - est
    if ok then after, rem = cur + cost, rem - cost end
    local reset, retry = now, 0
    if after > 0 then reset = (idx + 2) * W
    elseif prev > 0 then reset = (idx + 1) * W end
    if not ok then
      if cost > limit then retry = W
      else
        local room = limit - cost - cur
        if room >= 0 then
          retry = ceil(W - room * W / prev - elapsed)
        else
          retry = (idx + 1) * W - now + ceil(W - (limit - cost) * W / cur)
        end
        retry = max(1, retry)
      end
    end
    return ok, max(0, floor(rem)), reset, retry, limit, after, idx, prev, 0
  elseif alg == 3 then -- sliding log: ZSET of admitted units, score = ms
    local from = '(' .. format('%d', now - W)
    local count = call('ZCOUNT', key, from, '+inf')
    local ok = count + cost <= limit
    local after = count
    if ok then after = count + cost end
    local reset, retry = now, 0
    if after == 0 then reset = now
    elseif ok and cost > 0 then reset = now + W
    else reset = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) + W end
    if not ok then
      if cost > limit then retry = W
      else
        local r = call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
        retry = max(1, tonumber(r[2]) + W - now)
      end
    end
    return ok, limit - after, reset, retry, limit, after, 0, 0, count
  end
  -- fixed window: HASH w (window index), c (count)
  local idx = floor(now / W)
  local cur = 0
  if tonumber(s[1]) == idx then cur = tonumber(s[2]) end
  local ok = cur + cost <= limit
  local after, reset, retry = cur, now, 0
  if ok then after = cur + cost end
  if after > 0 then reset = (idx + 1) * W end
  if not ok then
    if cost > limit then retry = W else retry = (idx + 1) * W - now end
  end
  return ok, limit - after, reset, retry, limit, after, idx, 0, 0
end

-- consume writes what an allowed limit takes.
local function consume(alg, key, limit, W, cap, cost, after, idx, prev, count)
  if alg == 1 then
    local s = cache[key]
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[5] = after, now, ceil(cap * W / limit) + 1000
  elseif alg == 2 then
    local s = cache[key]
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[3], s[5] = idx, after, prev, 2 * W + 1000
  elseif alg == 3 then
    call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - W))
    -- Every admitted unit a member of its own (a key listed twice in one
    -- check is written twice, as in memory.go): named by the call's TIME
    -- in us, and within the call by a sequence, whatever window the
    -- checks of a batch count the key's members in.
    for j = 1, cost do
      seq = seq + 1
      call('ZADD', key, nowStr, format('%s-%06d.%d', stamp, count + j, seq))
    end
    call('PEXPIRE', key, format('%d', W))
  else
    local s = cache[key]
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[5] = idx, after, (idx + 1) * W - now + 1000
  end
end

-- violate records a violation of a denied limit with a penalty; enough of
-- them in the detection window block it. It returns retry and reset.
local function violate(vkey, bkey, pw, threshold, mult, W, retry, reset)
  call('ZREMRANGEBYSCORE', vkey, '-inf', format('%d', now - pw))
  local v = call('ZCARD', vkey) + 1
  seq = seq + 1
  call('ZADD', vkey, nowStr, format('%s-%06d.%d', stamp, v, seq))
  call('ZREMRANGEBYRANK', vkey, 0, format('%d', -vcap - 1))
  call('PEXPIRE', vkey, format('%d', pw))
  v = min(v, vcap)
  if v >= threshold then
    local block = W * mult[min(v - threshold, #mult - 1) + 1]
    call('SET', bkey, format('%d', now + block), 'PX', format('%d', block))
    return max(retry, block), max(reset, now + block)
  end
  return retry, reset
end

local out, o = {now}, 2

-- The specs the batch's limits refer to, each sent once per call:
-- {alg, limit, window, burst, cost, log_only, penalty window, threshold, multipliers}.
local SP, a = {}, 3
for i = 1, tonumber(ARGV[2]) do
  local sp = {tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), ARGV[a + 5] == '1', tonumber(ARGV[a + 6]), 0, false}
  a = a + 7
  if sp[7] > 0 then
    local mult = {}
    for j = 1, tonumber(ARGV[a + 1]) do mult[j] = tonumber(ARGV[a + 1 + j]) end
    sp[8], sp[9] = tonumber(ARGV[a]), mult
    a = a + 2 + #mult
  end
  SP[i] = sp
end

-- checkOne decides a check of one limit, all in locals.
local function checkOne(sp, key, vkey, bkey, write)
  local alg, limit, W, cost, logOnly, pw = sp[1], sp[2], sp[3], sp[5], sp[6], sp[7]
  local ok, remaining, reset, retry, cap, after, idx, prev, count = decideLimit(alg, key, limit, W, sp[4], cost)
  local blocked = false
  if pw > 0 then
    local b = tonumber(call('GET', bkey))
    if b and b > now then ok, blocked, remaining, retry, reset = false, true, 0, b - now, max(reset, b) end
  end
  local allowed = ok or logOnly
  if write then
    if ok and allowed then
      consume(alg, key, limit, W, cap, cost, after, idx, prev, count)
    elseif not allowed and pw > 0 and not blocked then
      retry, reset = violate(vkey, bkey, pw, sp[8], sp[9], W, retry, reset)
    end
  end
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
    allowed and 1 or 0, ok and 1 or 0, cap, remaining, reset, retry
end

-- checkMany decides a check of n limits, L[1..n], all-or-nothing.
local L = {}
local function checkMany(n, write)
  local allowed = true
  for i = 1, n do
    local l = L[i]
    local sp = l.sp
    l.ok, l.remaining, l.reset, l.retry, l.cap, l.after, l.idx, l.prev, l.count =
      decideLimit(sp[1], l.key, sp[2], sp[3], sp[4], sp[5])
    l.blocked = false
    if l.bkey then
      local b = tonumber(call('GET', l.bkey))
      if b and b > now then l.ok, l.blocked, l.remaining, l.retry, l.reset = false, true, 0, b - now, max(l.reset, b) end
    end
    if not l.ok and not sp[6] then allowed = false end
  end
  if write then
    for i = 1, n do
      local l = L[i]
      local sp = l.sp
      if allowed then
        if l.ok then
          consume(sp[1], l.key, sp[2], sp[3], l.cap, sp[5], l.after, l.idx, l.prev, l.count)
        end
      elseif not l.ok and not sp[6] and l.vkey and not l.blocked then
        l.retry, l.reset = violate(l.vkey, l.bkey, sp[7], sp[8], sp[9], sp[3], l.retry, l.reset)
      end
    end
  end
  out[o] = allowed and 1 or 0
  local p = o
  for i = 1, n do
    local l = L[i]
    out[p + 1], out[p + 2], out[p + 3], out[p + 4], out[p + 5] = l.ok and 1 or 0, l.cap, l.remaining, l.reset, l.retry
    p = p + 5
  end
end

local k, nc = 1, tonumber(ARGV[a])
a = a + 1
for c = 1, nc do
  local n = tonumber(ARGV[a])
  local write = n > 0
  if not write then n = -n end
  a = a + 1
  local ok, err
  if n == 1 then
    local sp = SP[tonumber(ARGV[a])]
    if sp[7] > 0 then
      ok, err = pcall(checkOne, sp, KEYS[k], KEYS[k + 1], KEYS[k + 2], write)
      k = k + 3
    else
      ok, err = pcall(checkOne, sp, KEYS[k], false, false, write)
      k = k + 1
    end
  else
    for i = 1, n do
      local l = L[i]
      if not l then
        l = {sp = false, key = false, vkey = false, bkey = false, ok = false, remaining = 0, reset = 0,
          retry = 0, cap = 0, after = 0, idx = 0, prev = 0, count = 0, blocked = false}
        L[i] = l
      end
      local sp = SP[tonumber(ARGV[a + i - 1])]
      l.sp, l.key = sp, KEYS[k]
      if sp[7] > 0 then
        l.vkey, l.bkey = KEYS[k + 1], KEYS[k + 2]
        k = k + 3
      else
        l.vkey, l.bkey = false, false
        k = k + 1
      end
    end
    ok, err = pcall(checkMany, n, write)
  end
  a = a + n
  -- A check that fails (a key of another type, say) fails alone: the
  -- checks after it are still decided.
  if not ok then
    if type(err) == 'table' then err = err.err end
    out[o] = tostring(err)
    for i = 1, 5 * n do out[o + i] = 0 end
  end
  o = o + 1 + 5 * n
end

for i = 1, nd do
  local key = dirty[i]
  local s = cache[key]
  local alg = s[4]
  if alg == 1 then
    -- %.17g: the tokens read back are exactly the float written; ts is
    -- always now.
    call('HSET', key, 'tokens', format('%.17g', s[1]), 'ts', nowStr)
  elseif alg == 2 then
    call('HSET', key, 'w', format('%d', s[1]), 'c', format('%d', s[2]), 'p', format('%d', s[3]))
  else
    call('HSET', key, 'w', format('%d', s[1]), 'c', format('%d', s[2]))
  end
  call('PEXPIRE', key, format('%d', s[5]))
end
return out
