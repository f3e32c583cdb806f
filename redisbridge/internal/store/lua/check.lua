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
--   limit, window_ms, burst, cost, flags (1: log_only, 2: fill, see
--   fillCost; 4: quota, see checkMany), lease size (0: none),
--   lease ttl_ms, max_delay_ms (-1: not a throttle limit), penalty
--   window_ms (0: no penalty) [, threshold, #multipliers, multipliers...]
-- then the number of checks, then per check: its number of limits
--   (negative: a peek, which writes nothing but returns), then per limit
--   its spec's number, negative when a lease return follows: units, tag,
--   granted.
-- KEYS: per check, per limit its counter key, then with a penalty its ":v" and ":b" keys.
-- Returns {now_ms, per check: allowed (1; 0: denied; -D: allowed to pass
-- D ms from now; or the error of a check that failed, as text), then per
-- limit: allowed, limit, remaining, reset_ms, retry_after_ms, lease
-- units, lease ttl_ms, lease tag}.
--
-- Leases (docs/bridge.md, Leases): an allowed check deducts a lease's
-- units with its own cost, in the same call, and names the grant by a tag.
-- Units handed back are given back before the check is decided. How
-- depends on the algorithm: fixed and sliding window leases end with
-- their window (tag: the window's index; units come back while it lasts);
-- sliding log leases are members scored at the lease's expiry, named
-- "L...", which a return removes (tag: that score); a token bucket keeps
-- the units of live leases in two generations (la/lae/ag, lb/lbe/bg:
-- units, expiry, tag: field g, "la,lae,ag,lb,lbe,bg", written once a
-- bucket is first leased), each held until twice the ttl after its last
-- grant, and never refills beyond burst minus them, so tokens plus the
-- units leases still hold never exceed the burst. A bucket never leased
-- is read and written as before leases existed.
--
-- Throttle limits (docs/config.md, throttle; max_delay_ms >= 0): one that
-- cannot take a request now reserves the earliest time it can, its slot,
-- up to max_delay_ms ahead; the request passes then (the proxy holds it),
-- and the limit counts it from this call on, so whoever comes next finds
-- the slot taken. A check's throttle limits all reserve at the latest of
-- their slots, T, and each stays exact at any time from its slot on: a
-- token bucket's tokens go below zero (its refill is spoken for until T);
-- a fixed window's count c, from the start of window w, runs on into the
-- windows after it, filled one after the other (a unit never straddles
-- two); a sliding log holds members scored at T, and a slot is never
-- earlier than the latest member, so the log's windows ending after T
-- hold no more than the one ending at T. The other limits of the check are
-- decided at now, as ever. A throttle limit that would have to wait more
-- than max_delay_ms denies, consuming nothing.
--
-- This runs in Redis's only thread for every request, so it is written for
-- speed: each spec parsed once per call, no closures or tables built per
-- check (a check of one limit, the usual, keeps its state in locals; the
-- limit tables of longer checks are reused from one check to the next),
-- and every HASH counter read and written once per call (below).
local call, tonumber, format, pcall, type, tostring, unpack, sub, match =
  redis.call, tonumber, string.format, pcall, type, tostring, unpack, string.sub, string.match
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
local function fields(key, alg)
  local s = cache[key]
  if not s then
    if alg == 2 then s = call('HMGET', key, 'w', 'c', 'p')
    elseif alg == 1 then s = call('HMGET', key, 'tokens', 'ts', 'g')
    else s = call('HMGET', key, 'w', 'c') end
    s[4], s[5] = alg, false -- the algorithm; the expiry in ms, once written
    cache[key] = s
  end
  return s
end

-- What leases need (docs/bridge.md, Leases) is made on first use, once
-- per call: most calls hold no lease, and every function a script defines
-- is made again each time it runs.
local LX
local function leasing()
  if LX then return LX end
  LX = {}

  -- held is what a token bucket's live leases hold at time t.
  local function held(t, la, lae, lb, lbe)
    local n = 0
    if t < lae then n = la end
    if t < lbe then n = n + lb end
    return n
  end

  -- gens returns a token bucket's lease generations as stored, {la, lae,
  -- ag, lb, lbe, bg}, parsed once into s[6]; false when it was never leased.
  local function gens(s)
    local g = s[6]
    if g == nil then
      g = false
      if s[3] then
        local a, b, c, d, e, f = match(s[3], '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
        if a then g = {tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e), tonumber(f)} end
      end
      s[6] = g
    end
    return g
  end

  -- tbNow is a token bucket's tokens at now. The refill stops at burst
  -- minus what live leases hold, a bound that rises when a generation of
  -- leases expires: so the refill is added segment by segment, up to each
  -- expiry in turn. It also returns what each generation holds at now
  -- (0 once it expired), kept in s[7] and s[8] for the write.
  local function tbNow(s, limit, W, cap)
    local g = gens(s)
    if not g then
      if s[1] then return min(cap, tonumber(s[1]) + max(0, now - tonumber(s[2])) * limit / W), 0, 0 end
      return cap, 0, 0
    end
    local la, lae, lb, lbe = g[1], g[2], g[4], g[5]
    local tokens = cap
    if s[1] then
      tokens = tonumber(s[1])
      local t = tonumber(s[2])
      local d1, d2 = lae, lbe
      if d2 < d1 then d1, d2 = d2, d1 end
      if d1 > t and d1 < now then
        tokens = min(max(0, cap - held(t, la, lae, lb, lbe)), tokens + (d1 - t) * limit / W)
        t = d1
      end
      if d2 > t and d2 < now then
        tokens = min(max(0, cap - held(t, la, lae, lb, lbe)), tokens + (d2 - t) * limit / W)
        t = d2
      end
      tokens = min(max(0, cap - held(t, la, lae, lb, lbe)), tokens + max(0, now - t) * limit / W)
    end
    if lae <= now then la = 0 end
    if lbe <= now then lb = 0 end
    return tokens, la, lb
  end

  -- tbWrite stores a token bucket's tokens at now, with its generations as
  -- they hold at now (s[7], s[8]).
  local function tbWrite(key, s, tokens, limit, W, cap)
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    local exp = ceil((cap - min(0, tokens)) * W / limit) + 1000
    local g = s[6]
    if g then
      g[1], g[4] = s[7], s[8]
      if g[1] > 0 then exp = max(exp, g[2] - now + 1000) end
      if g[4] > 0 then exp = max(exp, g[5] - now + 1000) end
    end
    s[1], s[2], s[5] = tokens, now, exp
  end

  -- addMembers adds n members of score to a ZSET, named prefix..k..suffix
  -- for k from k0 + 1 on, skipping names taken (a return may have removed
  -- members, so counts alone do not keep names apart).
  local margs = {}
  local function addMembers(key, score, prefix, k, suffix, n)
    while n > 0 do
      local j = 0
      for i = 1, min(n, 64) do
        k = k + 1
        margs[j + 1], margs[j + 2] = score, prefix .. k .. suffix
        j = j + 2
      end
      n = n - call('ZADD', key, 'NX', unpack(margs, 1, j))
    end
  end

  -- giveBack takes back the unspent units ru of a lease granted with tag rt
  -- and rg units, when the store still holds them (see the head).
  local function giveBack(alg, key, limit, W, cap, rt, rg, ru)
    if alg == 1 then
      local s = fields(key, 1)
      local tokens, la, lb = tbNow(s, limit, W, cap)
      local g = s[6]
      if not g then return end
      if rt == g[3] and la > 0 then la = max(0, la - rg)
      elseif rt == g[6] and lb > 0 then lb = max(0, lb - rg)
      else return end
      s[7], s[8] = la, lb
      tbWrite(key, s, min(max(0, cap - (la + lb)), tokens + ru), limit, W, cap)
    elseif alg == 2 then
      local idx = floor(now / W)
      local s = fields(key, 2)
      local cur, prev, w = 0, 0, tonumber(s[1])
      if w == idx then cur, prev = tonumber(s[2]), tonumber(s[3])
      elseif w == idx - 1 then prev = tonumber(s[2]) end
      if rt == idx then cur = max(0, cur - ru)
      elseif rt == idx - 1 then prev = max(0, prev - ru)
      else return end
      if not s[5] then nd = nd + 1; dirty[nd] = key end
      s[1], s[2], s[3], s[5] = idx, cur, prev, 2 * W + 1000
    elseif alg == 3 then
      local ms = call('ZREVRANGEBYSCORE', key, format('%d', rt), format('%d', rt), 'LIMIT', 0, ru)
      local j = 0
      for i = 1, #ms do
        if sub(ms[i], 1, 1) == 'L' then j = j + 1; margs[j] = ms[i] end
      end
      if j > 0 then call('ZREM', key, unpack(margs, 1, j)) end
    else
      local idx = floor(now / W)
      local s = fields(key, 4)
      if rt ~= idx or tonumber(s[1]) ~= idx then return end
      if not s[5] then nd = nd + 1; dirty[nd] = key end
      s[2], s[5] = max(0, tonumber(s[2]) - ru), (idx + 1) * W - now + 1000
    end
  end

  -- lease grants an allowed limit a lease of up to sp[10] units of what its
  -- check left (at least its cost, else none). It returns the units, their
  -- ttl_ms and tag, and after, remaining and reset with them deducted.
  local function lease(alg, sp, key, cap, cost, after, remaining, reset, idx)
    local size, ttl, limit, W = sp[10], sp[11], sp[2], sp[3]
    local n
    if alg == 1 then n = min(size, floor(after))
    elseif alg == 2 then n = min(size, remaining)
    else n = min(size, limit - after) end
    if n < max(1, cost) then return 0, 0, 0, after, remaining, reset end
    if alg == 1 then
      local s = cache[key]
      local g = s[6]
      if not g then g = {0, 0, 0, 0, 0, 0}; s[6] = g end
      local la, lae, ag, lb, lbe, bg = s[7] or 0, g[2], g[3], s[8] or 0, g[5], g[6]
      if la > 0 and lb == 0 then la, lae, ag, lb, lbe, bg = 0, 0, ag, la, lae, ag end
      if la == 0 then ag, lae = max(now, ag + 1, bg + 1), 0 end
      -- Held for twice the ttl: units handed back at the lease's end (a
      -- proxy notices within a tick) find their generation still there.
      la, lae = la + n, max(lae, now + 2 * ttl)
      g[2], g[3], g[5], g[6] = lae, ag, lbe, bg
      s[7], s[8] = la, lb
      after = after - n
      return n, ttl, ag, after, floor(after), now + ceil((cap - after) * W / limit)
    elseif alg == 3 then
      return n, ttl, now + ttl, after + n, remaining - n, max(reset, now + ttl + W)
    end
    return n, min(ttl, (idx + 1) * W - now), idx, after + n, remaining - n, reset
  end

  LX.tbNow, LX.tbWrite, LX.addMembers, LX.giveBack, LX.lease = tbNow, tbWrite, addMembers, giveBack, lease
  return LX
end

-- tokensNow is a token bucket's tokens at now, from its fields s; a
-- bucket ever leased keeps what its lease generations hold at now in s[7]
-- and s[8] for the write.
local function tokensNow(s, limit, W, cap)
  if s[3] or s[6] then
    local tokens, la, lb = leasing().tbNow(s, limit, W, cap)
    s[7], s[8] = la, lb
    return tokens
  elseif s[1] then
    return min(cap, tonumber(s[1]) + max(0, now - tonumber(s[2])) * limit / W)
  end
  return cap
end

-- A fixed window of calendar months (UTC; months > 0, see script.go)
-- holds months months, counted from January 1970; any other, W ms from
-- the epoch. fwIndex is the index of the window holding t (ms), fwStart
-- when window idx starts: rules.LimitSpec's FixedWindowIndex and
-- FixedWindowStart, with the days of a month reckoned by Howard
-- Hinnant's civil calendar algorithms (eras of 400 years from March).
local function fwIndex(t, W, months)
  if months == 0 then return floor(t / W) end
  local z = floor(t / 86400000) + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local mp = floor((5 * (doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))) + 2) / 153)
  -- mp counts months from March: January and February end the year.
  return floor(((era * 400 + yoe - 1970) * 12 + mp + 2) / months)
end

local function fwStart(idx, W, months)
  if months == 0 then return idx * W end
  local m = idx * months + 10 -- months from March 1969
  local y = 1969 + floor(m / 12)
  local mp = m - floor(m / 12) * 12
  local era = floor(y / 400)
  local yoe = y - era * 400
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + floor((153 * mp + 2) / 5)
  return (era * 146097 + doe - 719468) * 86400000
end

-- fwCount is a fixed window's count in window idx: the units counted from
-- the stored window w on; a window after idx (the clock went back) counts
-- as this one. Only a throttle limit's count runs on into later windows
-- (carry: less the windows that ended since, of limit units each); any
-- other's ends with its window, so that a limit lowered since does not
-- find the count it was written under carried into a later window.
local function fwCount(s, idx, limit, carry)
  local w = tonumber(s[1])
  if not w then return 0 end
  local c = tonumber(s[2])
  if w >= idx then return c end
  if not carry then return 0 end
  return max(0, c - (idx - w) * limit)
end

-- fillCost is what a fill limit (spec flag 2) with room units left takes
-- of cost: all of it, or the room when less; with no unit left, one, so
-- that it is denied with the retry of one unit. A fill limit's remaining
-- is its room, what it had before the check: what it took follows from
-- the two (script.go, fill).
local function fillCost(room, cost)
  if room < 1 then return 1 end
  return min(cost, room)
end

-- decideLimit decides one limit without writing. It returns ok, remaining,
-- reset, retry, cap (the limit reported), and the state to write when the
-- check is allowed: after, idx, prev (sliding window), count (sliding
-- log), and the cost it decided (a fill limit's, see fillCost). One
-- function for the four algorithms: a script call builds each of its
-- functions anew, which a batch of one check notices.
local function decideLimit(alg, key, limit, W, cap, cost, fill, months)
  local s
  if alg ~= 3 then s = fields(key, alg) end
  if alg == 1 then -- token bucket: HASH tokens, ts, g (leases)
    local tokens = tokensNow(s, limit, W, cap)
    if fill then cost = fillCost(floor(tokens), cost) end
    local ok = tokens >= cost
    local after, retry = tokens, 0
    if ok then after = tokens - cost
    elseif cost > cap then retry = W
    else retry = ceil((cost - tokens) * W / limit) end
    local remaining = after
    if fill then remaining = tokens end
    return ok, max(0, floor(remaining)), now + ceil((cap - after) * W / limit), retry, cap, after, 0, 0, 0, cost
  elseif alg == 2 then -- sliding window, weighted: HASH w (window index), c (count), p (previous count)
    local idx = floor(now / W)
    local cur, prev, w = 0, 0, tonumber(s[1])
    if w == idx then cur, prev = tonumber(s[2]), tonumber(s[3])
    elseif w == idx - 1 then prev = tonumber(s[2]) end
    local elapsed = now - idx * W
    local est = prev * ((W - elapsed) / W) + cur
    local rem = limit - est
    if fill then cost = fillCost(floor(rem), cost) end
    local ok = est + cost <= limit
    local after = cur
    if ok then
      after = cur + cost
      if not fill then rem = rem - cost end
    end
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
    return ok, max(0, floor(rem)), reset, retry, limit, after, idx, prev, 0, cost
  elseif alg == 3 then -- sliding log: ZSET of admitted units, score = ms
    local from = '(' .. format('%d', now - W)
    local count = call('ZCOUNT', key, from, '+inf')
    if fill then cost = fillCost(limit - count, cost) end
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
    local remaining = limit - after
    if fill then remaining = max(0, limit - count) end
    return ok, remaining, reset, retry, limit, after, 0, 0, count, cost
  end
  -- fixed window: HASH w (window index), c (count, see fwCount)
  local idx = fwIndex(now, W, months)
  local ends = fwStart(idx + 1, W, months)
  local cur = fwCount(s, idx, limit, false)
  if fill then cost = fillCost(limit - cur, cost) end
  local ok = cur + cost <= limit
  local after, reset, retry = cur, now, 0
  if ok then after = cur + cost end
  if after > 0 then reset = ends end
  if not ok then
    if cost > limit then retry = W else retry = ends - now end
  end
  local remaining = max(0, limit - after)
  if fill then remaining = max(0, limit - cur) end
  return ok, remaining, reset, retry, limit, after, idx, 0, 0, cost
end

-- slotOf returns, for a throttle limit, the earliest time from now on at
-- which it can take cost (false when it never can: cost above cap),
-- remaining and reset as the limit stands, and what reserve needs: the
-- tokens (token bucket), the count (fixed window, sliding log) and the
-- latest member's score (sliding log).
local function slotOf(alg, key, limit, W, cap, cost)
  local slot, remaining, reset, st, top
  if alg == 1 then
    st = tokensNow(fields(key, 1), limit, W, cap)
    slot = now
    if st < cost then slot = now + ceil((cost - st) * W / limit) end
    remaining, reset = max(0, floor(st)), now + ceil((cap - st) * W / limit)
  elseif alg == 4 then
    local idx = floor(now / W)
    st = fwCount(fields(key, 4), idx, limit, true)
    local j = floor(st / limit)
    if st - j * limit + cost > limit then j = j + 1 end
    slot = now
    if j > 0 then slot = (idx + j) * W end
    remaining, reset = max(0, limit - st), now
    if st > 0 then reset = (idx + floor((st - 1) / limit) + 1) * W end
  else
    st = call('ZCOUNT', key, '(' .. format('%d', now - W), '+inf')
    top = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) or now
    slot = max(now, top)
    -- The window ending at the slot may hold limit - cost members: the
    -- one before them, counted from the top, must have left it.
    local r = call('ZRANGE', key, cost - limit - 1, cost - limit - 1, 'WITHSCORES')
    if r[2] then slot = max(slot, tonumber(r[2]) + W) end
    remaining, reset = max(0, limit - st), now
    if st > 0 then reset = top + W end
  end
  if cost > cap then slot = false end
  return slot, remaining, reset, st, top
end

-- tbSet stores a token bucket's tokens at now (below 0 when a throttle
-- limit holds slots ahead: the key lives until they have refilled).
local function tbSet(key, tokens, limit, W, cap)
  local s = cache[key]
  if s[6] then
    leasing().tbWrite(key, s, tokens, limit, W, cap)
  else
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[5] = tokens, now, ceil((cap - min(0, tokens)) * W / limit) + 1000
  end
end

-- reserve writes what a throttle limit takes for a request passing at T,
-- its slot or later, from what slotOf returned; it returns remaining and
-- reset after.
local function reserve(alg, key, limit, W, cap, cost, T, st, top)
  if alg == 1 then
    -- Taken at T: the tokens at T, capped at cap, less cost, as tokens at now.
    local after = st - cost - max(0, st + (T - now) * limit / W - cap)
    tbSet(key, after, limit, W, cap)
    return max(0, floor(after)), now + ceil((cap - after) * W / limit)
  elseif alg == 4 then
    local idx = floor(now / W)
    local c = max(st, (floor(T / W) - idx) * limit) + cost
    local last, reset = idx, now
    if c > 0 then
      last = idx + floor((c - 1) / limit)
      reset = (last + 1) * W
    end
    local s = cache[key]
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[5] = idx, c, (last + 1) * W - now + 1000
    return max(0, limit - c), reset
  end
  call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now - W))
  local at = format('%d', T)
  for j = 1, cost do
    seq = seq + 1
    call('ZADD', key, at, format('%s-%06d.%d', stamp, st + j, seq))
  end
  top = max(top, T)
  call('PEXPIRE', key, format('%d', top + W - now))
  local remaining = 0
  if T == now then remaining = max(0, limit - st - cost) end
  return remaining, top + W
end

-- consume writes what an allowed limit takes, with the lease of ln units
-- and tag lt granted with it. i is the limit's place in its check.
local function consume(i, alg, key, limit, W, cap, cost, after, idx, prev, count, ln, lt, months)
  if alg == 1 then
    tbSet(key, after, limit, W, cap)
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
    -- A lease's units are members scored at its expiry: every unit it
    -- admits is in the log for a window from then, as if admitted then.
    -- The limit's index keeps a key listed twice apart in their names.
    if ln > 0 then
      local tag = ''
      if i > 1 then tag = '.' .. i end
      leasing().addMembers(key, lt, format('L%d-', lt), count, tag, ln)
    end
    local top = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) or now
    call('PEXPIRE', key, format('%d', max(W, top + W - now)))
  else
    local s = cache[key]
    if not s[5] then nd = nd + 1; dirty[nd] = key end
    s[1], s[2], s[5] = idx, after, fwStart(idx + 1, W, months) - now + 1000
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
-- {alg, limit, window, burst, cost, log_only, penalty window, threshold,
-- multipliers, lease size, lease ttl, max delay, fill, quota, months}.
-- A log-only limit is never a quota limit: it denies nothing.
local SP, a = {}, 3
for i = 1, tonumber(ARGV[2]) do
  local flags = tonumber(ARGV[a + 5])
  local sp = {tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), flags % 2 == 1, tonumber(ARGV[a + 10]), 0, false,
    tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8]), flags % 4 >= 2,
    flags % 2 == 0 and flags >= 4, tonumber(ARGV[a + 9])}
  -- A sliding window estimates: it is never throttled (script.go sends
  -- none; this keeps a slip from reading its HASH as a log).
  if sp[1] == 2 then sp[12] = -1 end
  a = a + 11
  if sp[7] > 0 then
    local mult = {}
    for j = 1, tonumber(ARGV[a + 1]) do mult[j] = tonumber(ARGV[a + 1 + j]) end
    sp[8], sp[9] = tonumber(ARGV[a]), mult
    a = a + 2 + #mult
  end
  SP[i] = sp
end

-- A limit is leased when it asks for a lease (sp[10] > 0) and is
-- enforced, without a penalty: a penalty's violations are counted here.

-- throttleOne decides a check of one throttle limit (see the head).
local function throttleOne(sp, key, vkey, bkey, write)
  local alg, limit, W, cap, cost, pw, md = sp[1], sp[2], sp[3], sp[4], sp[5], sp[7], sp[12]
  if alg ~= 1 then cap = limit end
  local slot, remaining, reset, st, top = slotOf(alg, key, limit, W, cap, cost)
  local ok, blocked, retry, T = slot ~= false, false, 0, slot or now
  if not ok then retry = W end
  if pw > 0 then
    local b = tonumber(call('GET', bkey))
    if b and b > now then ok, blocked, remaining, retry, reset = false, true, 0, b - now, max(reset, b) end
  end
  if ok and T - now > md then ok, retry = false, T - now - md end
  if write then
    if ok then
      remaining, reset = reserve(alg, key, limit, W, cap, cost, T, st, top)
    elseif pw > 0 and not blocked then
      retry, reset = violate(vkey, bkey, pw, sp[8], sp[9], W, retry, reset)
    end
  end
  local head = 0
  if ok then head = now - T; if head == 0 then head = 1 end end
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7], out[o + 8] =
    head, ok and 1 or 0, cap, remaining, reset, retry, 0, 0, 0
end

-- checkOne decides a check of one limit, all in locals; ru, rt, rg hand
-- back a lease first.
local function checkOne(sp, key, vkey, bkey, write, ru, rt, rg)
  local alg, limit, W, cost, logOnly, pw = sp[1], sp[2], sp[3], sp[5], sp[6], sp[7]
  if ru > 0 then leasing().giveBack(alg, key, limit, W, sp[4], rt, rg, ru) end
  if sp[12] >= 0 then return throttleOne(sp, key, vkey, bkey, write) end
  local ok, remaining, reset, retry, cap, after, idx, prev, count
  ok, remaining, reset, retry, cap, after, idx, prev, count, cost = decideLimit(alg, key, limit, W, sp[4], cost, sp[13], sp[15])
  local blocked = false
  if pw > 0 then
    local b = tonumber(call('GET', bkey))
    if b and b > now then ok, blocked, remaining, retry, reset = false, true, 0, b - now, max(reset, b) end
  end
  local allowed = ok or logOnly
  local ln, lt, lg = 0, 0, 0
  if write then
    if ok and allowed then
      if sp[10] > 0 and not logOnly and pw == 0 then
        ln, lt, lg, after, remaining, reset = leasing().lease(alg, sp, key, cap, cost, after, remaining, reset, idx)
      end
      consume(1, alg, key, limit, W, cap, cost, after, idx, prev, count, ln, lg, sp[15])
    elseif not allowed and pw > 0 and not blocked then
      retry, reset = violate(vkey, bkey, pw, sp[8], sp[9], W, retry, reset)
    end
  end
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7], out[o + 8] =
    allowed and 1 or 0, ok and 1 or 0, cap, remaining, reset, retry, ln, lt, lg
end

-- checkMany decides a check of n limits, L[1..n], all-or-nothing: the
-- throttle limits at T, the latest of their slots, the others at now.
-- Its quota limits deny it only all together (one alone is as any other
-- limit, so checkOne need not know them).
local L = {}
local function checkMany(n, write)
  for i = 1, n do
    local l = L[i]
    if l.ru > 0 then leasing().giveBack(l.sp[1], l.key, l.sp[2], l.sp[3], l.sp[4], l.rt, l.rg, l.ru) end
  end
  local allowed, T = true, now
  for i = 1, n do
    local l = L[i]
    local sp = l.sp
    local slot
    if sp[12] >= 0 then
      l.cap = sp[4]
      if sp[1] ~= 1 then l.cap = sp[2] end
      slot, l.remaining, l.reset, l.after, l.top = slotOf(sp[1], l.key, sp[2], sp[3], l.cap, sp[5])
      l.ok, l.retry = slot ~= false, 0
      if not l.ok then l.retry = sp[3] end
    else
      l.ok, l.remaining, l.reset, l.retry, l.cap, l.after, l.idx, l.prev, l.count, l.cost =
        decideLimit(sp[1], l.key, sp[2], sp[3], sp[4], sp[5], sp[13], sp[15])
    end
    l.blocked = false
    if l.bkey then
      local b = tonumber(call('GET', l.bkey))
      if b and b > now then l.ok, l.blocked, l.remaining, l.retry, l.reset = false, true, 0, b - now, max(l.reset, b) end
    end
    if sp[12] >= 0 and l.ok then T = max(T, slot) end
  end
  local quotas, quotaOk = false, false
  for i = 1, n do
    local l = L[i]
    local md = l.sp[12]
    if md >= 0 and l.ok and T - now > md then l.ok, l.retry = false, T - now - md end
    if l.sp[14] then
      quotas = true
      if l.ok then quotaOk = true end
    elseif not l.ok and not l.sp[6] then allowed = false end
  end
  if quotas and not quotaOk then allowed = false end
  if write then
    for i = 1, n do
      local l = L[i]
      local sp = l.sp
      l.ln, l.lt, l.lg = 0, 0, 0
      if allowed then
        if sp[12] >= 0 then
          l.remaining, l.reset = reserve(sp[1], l.key, sp[2], sp[3], l.cap, sp[5], T, l.after, l.top)
        elseif l.ok then
          -- A key listed twice is written once per listing, the last
          -- write holding: a lease of it could be granted twice for one
          -- deduction, so such a key is never leased.
          if sp[10] > 0 and not sp[6] and sp[7] == 0 then
            local once = true
            for j = 1, n do
              if j ~= i and L[j].key == l.key then once = false end
            end
            if once then
              l.ln, l.lt, l.lg, l.after, l.remaining, l.reset =
                leasing().lease(sp[1], sp, l.key, l.cap, sp[5], l.after, l.remaining, l.reset, l.idx)
            end
          end
          consume(i, sp[1], l.key, sp[2], sp[3], l.cap, l.cost, l.after, l.idx, l.prev, l.count, l.ln, l.lg, sp[15])
        end
      elseif not l.ok and not sp[6] and l.vkey and not l.blocked then
        l.retry, l.reset = violate(l.vkey, l.bkey, sp[7], sp[8], sp[9], sp[3], l.retry, l.reset)
      end
    end
  end
  out[o] = 0
  if allowed then
    out[o] = now - T
    if T == now then out[o] = 1 end
  end
  local p = o
  for i = 1, n do
    local l = L[i]
    if not write then l.ln, l.lt, l.lg = 0, 0, 0 end
    out[p + 1], out[p + 2], out[p + 3], out[p + 4], out[p + 5], out[p + 6], out[p + 7], out[p + 8] =
      l.ok and 1 or 0, l.cap, l.remaining, l.reset, l.retry, l.ln, l.lt, l.lg
    p = p + 8
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
    local r, ru, rt, rg = tonumber(ARGV[a]), 0, 0, 0
    if r < 0 then
      r, ru, rt, rg = -r, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
      a = a + 3
    end
    a = a + 1
    local sp = SP[r]
    if sp[7] > 0 then
      ok, err = pcall(checkOne, sp, KEYS[k], KEYS[k + 1], KEYS[k + 2], write, ru, rt, rg)
      k = k + 3
    else
      ok, err = pcall(checkOne, sp, KEYS[k], false, false, write, ru, rt, rg)
      k = k + 1
    end
  else
    for i = 1, n do
      local l = L[i]
      if not l then
        l = {sp = false, key = false, vkey = false, bkey = false, ok = false, remaining = 0, reset = 0,
          retry = 0, cap = 0, after = 0, idx = 0, prev = 0, count = 0, cost = 0, blocked = false,
          ru = 0, rt = 0, rg = 0, ln = 0, lt = 0, lg = 0, top = 0}
        L[i] = l
      end
      local r = tonumber(ARGV[a])
      a = a + 1
      l.ru, l.rt, l.rg = 0, 0, 0
      if r < 0 then
        r, l.ru, l.rt, l.rg = -r, tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
        a = a + 3
      end
      local sp = SP[r]
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
  -- A check that fails (a key of another type, say) fails alone: the
  -- checks after it are still decided.
  if not ok then
    if type(err) == 'table' then err = err.err end
    out[o] = tostring(err)
    for i = 1, 8 * n do out[o + i] = 0 end
  end
  o = o + 1 + 8 * n
end

for i = 1, nd do
  local key = dirty[i]
  local s = cache[key]
  local alg = s[4]
  if alg == 1 then
    -- %.17g: the tokens read back are exactly the float written; ts is
    -- always now.
    local g = s[6]
    if g then
      -- A bucket ever leased keeps its generations, and its tags only grow.
      call('HSET', key, 'tokens', format('%.17g', s[1]), 'ts', nowStr,
        'g', format('%d,%d,%d,%d,%d,%d', g[1], g[2], g[3], g[4], g[5], g[6]))
    else
      call('HSET', key, 'tokens', format('%.17g', s[1]), 'ts', nowStr)
    end
  elseif alg == 2 then
    call('HSET', key, 'w', format('%d', s[1]), 'c', format('%d', s[2]), 'p', format('%d', s[3]))
  else
    call('HSET', key, 'w', format('%d', s[1]), 'c', format('%d', s[2]))
  end
  call('PEXPIRE', key, format('%d', s[5]))
end
return out
