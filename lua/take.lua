-- take.lua: check and take from every token bucket of one request at once, all or nothing.
--
-- KEYS[1..n]  the bucket keys (strings "level ts_ms", written by this script and adjust.lua;
--             a budget's "level ts_ms amount": the amount its level was counted from)
-- KEYS[n+1]   optional: the tenant's concurrency lease ZSET (member -> expiry ms)
-- ARGV[1]     n, the number of buckets (it tells whether KEYS[n+1] is a lease key)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]   bucket i: capacity, refill per ms, cost (cost >= 0);
--             a refill of -1 or -2 makes the bucket a spend budget of a UTC day or month
-- ARGV[3n+2], ARGV[3n+3], ARGV[3n+4] with a lease key: member, limit, TTL ms
--
-- Returns a flat array:
--   [1] 1 if every bucket and the lease had room and all was taken, else 0 (nothing taken)
--   [2] now in ms, from TIME (string, %.17g, so the caller can replay the decision)
--   then per bucket, 4 items:
--       allowed         1 if this bucket held its cost (even if another part refused), else 0
--       remaining       the level after the call (string, %.17g; fractional, negative = debt)
--       retry_after_ms  whole ms until the bucket holds its cost (0: it does; -1: never,
--                       the cost exceeds the capacity or nothing refills)
--       reset_ms        whole ms until the bucket is full (-1: never, nothing refills)
--   then, with a lease key, 2 items: allowed (1 if a slot was free or the member held one),
--       the number of leases in flight after the call
--
-- Time is Redis's own (TIME), never the caller's: every gateway replica shares one clock.
-- Requires Redis >= 5 (scripts are replicated by their effects, so TIME is allowed).

-- #include bucket_time.lua

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = tonumber(ARGV[1])

local caps, rates, costs, levels, stamps = {}, {}, {}, {}, {}
local holds, budgets = {}, {}
-- A budget's ms to the end of its period (nil: not a budget).
local ends = {}
local ok = true
for i = 1, n do
  local a = 3 * i - 1
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local level, ts = cap, now  -- a missing (expired) bucket is full
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
  if rate < 0 then
    local start, stop = period_bounds(now, rate)
    if ts < start then level = cap end  -- a new period: the whole budget again
    ends[i] = stop - now
    rate = 0
  end
  local elapsed = now - ts
  if elapsed < 0 then
    -- The clock went back (a failover): no refill until it passes ts again.
    elapsed = 0
  else
    ts = now
  end
  level = math.min(cap, level + elapsed * rate)
  caps[i], rates[i], costs[i], levels[i], stamps[i] = cap, rate, cost, level, ts
  budgets[i] = budget
  holds[i] = cost <= cap and level >= cost
  if not holds[i] then ok = false end
end

local lease_key = KEYS[n + 1]
local lease_ok, in_flight = false, 0
if lease_key then
  local a = 3 * n + 2
  local member, limit, ttl = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  -- Leases of gateways that died expire: they hold a slot no longer than their TTL.
  redis.call('ZREMRANGEBYSCORE', lease_key, '-inf', fmt(now))
  in_flight = redis.call('ZCARD', lease_key)
  local held = redis.call('ZSCORE', lease_key, member)
  -- A member that already holds a slot (a retried call) keeps it and only renews it.
  lease_ok = held ~= false or in_flight < limit
  if not lease_ok then ok = false end
  if ok then
    redis.call('ZADD', lease_key, fmt(now + ttl), member)
    if not held then in_flight = in_flight + 1 end
    if redis.call('PTTL', lease_key) < ttl + MARGIN_MS then
      redis.call('PEXPIRE', lease_key, fmt(ttl + MARGIN_MS))
    end
  end
end

local out = {ok and 1 or 0, fmt(now)}
for i = 1, n do
  local level, retry = levels[i], 0
  if ok then
    level = math.min(caps[i], level - costs[i])
  elseif costs[i] > caps[i] then
    retry = -1
  else
    retry = wait_ms(level, costs[i], rates[i])
  end
  local reset = wait_ms(level, caps[i], rates[i])
  local ends_in = ends[i]
  if ends_in then
    -- A budget is whole again when its period ends, and the key goes with it.
    local whole = math.ceil(ends_in)
    if retry ~= 0 and costs[i] <= caps[i] then retry = whole end
    if reset ~= 0 then reset = whole end
  end
  -- Refused calls store the refilled level too, so retry_after_ms is exact from this state.
  local state = fmt(level) .. ' ' .. fmt(stamps[i])
  if budgets[i] then state = state .. ' ' .. fmt(caps[i]) end
  if ends_in then
    redis.call('SET', KEYS[i], state, 'PX', fmt(math.ceil(ends_in) + MARGIN_MS))
  elseif reset < 0 then
    redis.call('SET', KEYS[i], state)  -- never refills: must not expire into a full bucket
  else
    redis.call('SET', KEYS[i], state, 'PX', fmt(reset + MARGIN_MS))
  end
  out[#out + 1] = holds[i] and 1 or 0
  out[#out + 1] = fmt(level)
  out[#out + 1] = retry
  out[#out + 1] = reset
end
if lease_key then
  out[#out + 1] = lease_ok and 1 or 0
  out[#out + 1] = in_flight
end
return out
