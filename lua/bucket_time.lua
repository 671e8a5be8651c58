-- bucket_time.lua: what take.lua and adjust.lua share, included at the head of each
-- (`-- #include bucket_time.lua`, expanded by gateway/storage/scripts.py when read): the
-- numbers' text, the wait for a level, and a budget's calendar period by Redis's clock.

local MARGIN_MS = 1000  -- idle keys outlive their time-to-full by this much
local MAX_MS = 9007199254740992  -- 2^53: waits are capped here (about 285,000 years)

-- %.17g round-trips every double, so the Python model sees exactly what Redis computed.
local function fmt(x)
  return string.format('%.17g', x)
end

-- The fewest whole ms after which level + ms * rate >= target: 0 now, -1 never.
local function wait_ms(level, target, rate)
  if level >= target then return 0 end
  if rate <= 0 then return -1 end
  local x = (target - level) / rate
  if x >= MAX_MS then return MAX_MS end
  local w = math.ceil(x)
  -- The quotient is rounded: settle on the exact boundary of the refill expression.
  if level + w * rate < target then
    w = w + 1
  elseif w > 1 and level + (w - 1) * rate >= target then
    w = w - 1
  end
  return w
end

-- A spend budget is a bucket that refills all at once at the start of each calendar
-- period, by Redis's clock (so gateways whose clocks differ agree on the period): its
-- refill rate is -1 for a UTC day, -2 for a UTC month (0, as for any bucket, is never).
local DAY_MS = 86400000

-- Days since 1970-01-01 of a civil date (Howard Hinnant's days_from_civil).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- The start and end (ms) of the period holding `now`, for a period rate (< 0).
local function period_bounds(now, rate)
  local day = math.floor(now / DAY_MS)
  if rate == -1 then return day * DAY_MS, (day + 1) * DAY_MS end
  -- civil_from_days: the year and month of `day`.
  local z = day + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days_from_civil(y, m, 1) * DAY_MS, days_from_civil(ny, nm, 1) * DAY_MS
end
