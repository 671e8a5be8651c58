-- adjust.lua: charge or refund token buckets after the fact, and release or renew a lease.
--
-- KEYS[1..n]  the bucket keys (the same state strings take.lua writes)
-- KEYS[n+1]   the concurrency lease ZSET, when ARGV[2] is not 0
-- ARGV[1]     n, the number of buckets (may be 0: a lease operation alone)
-- ARGV[2]     the lease operation: 0 none, 1 release the member, 2 renew the member
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2]   bucket i: capacity, refill per ms (-1, -2: a budget
--             of a UTC day or month, as in take.lua), delta
--             (delta > 0 charges more and may leave a debt that refill pays off;
--              delta < 0 refunds, never above the capacity)
-- ARGV[3n+3], ARGV[3n+4]  with a lease operation: member, TTL ms (used by renew)
--
-- Returns a flat array:
--   [1] now in ms, from TIME (string, %.17g)
--   [2] 1 if the lease member held an unexpired slot (and was released or renewed), else 0
--   then per bucket: the level after the call (string, %.17g; negative = debt)

-- #include bucket_time.lua

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = tonumber(ARGV[1])
local op = ARGV[2]

local out = {fmt(now), 0}
for i = 1, n do
  local a = 3 * i
  local cap, rate, delta = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local level, ts = cap, now
  local state = redis.call('GET', KEYS[i])
  local amount = cap
  if state then
    local sp = string.find(state, ' ', 1, true)
    level = tonumber(string.sub(state, 1, sp - 1))
    local sp2 = string.find(state, ' ', sp + 1, true)
    if sp2 then  -- a budget's state also holds the amount its level was counted from
      ts = tonumber(string.sub(state, sp + 1, sp2 - 1))
      amount = tonumber(string.sub(state, sp2 + 1))
    else
      ts = tonumber(string.sub(state, sp + 1))
    end
  end
  local budget = rate <= 0
  if budget then
    -- A budget whose amount changed keeps what was spent: raised, the difference is
    -- there to spend; lowered below what was spent, it is in debt. (A rate bucket's
    -- level carries over as it is, and refills.)
    level = level + (cap - amount)
  end
  local ends_in = nil
  if rate < 0 then  -- a budget (take.lua): whole again in each new period
    local start, stop = period_bounds(now, rate)
    if ts < start then level = cap end
    ends_in = stop - now
    rate = 0
  end
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
  else
    ts = now
  end
  level = math.min(cap, math.min(cap, level + elapsed * rate) - delta)
  local reset = wait_ms(level, cap, rate)
  state = fmt(level) .. ' ' .. fmt(ts)
  if budget then state = state .. ' ' .. fmt(cap) end
  if ends_in then
    redis.call('SET', KEYS[i], state, 'PX', fmt(math.ceil(ends_in) + MARGIN_MS))
  elseif reset < 0 then
    redis.call('SET', KEYS[i], state)
  else
    redis.call('SET', KEYS[i], state, 'PX', fmt(reset + MARGIN_MS))
  end
  out[#out + 1] = fmt(level)
end

if op ~= '0' then
  local key, member = KEYS[n + 1], ARGV[3 * n + 3]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  if op == '1' then
    out[2] = redis.call('ZREM', key, member)
  elseif redis.call('ZSCORE', key, member) then
    local ttl = tonumber(ARGV[3 * n + 4])
    redis.call('ZADD', key, fmt(now + ttl), member)
    if redis.call('PTTL', key) < ttl + MARGIN_MS then
      redis.call('PEXPIRE', key, fmt(ttl + MARGIN_MS))
    end
    out[2] = 1
  end
end
return out
