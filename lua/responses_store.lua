-- A tenant's stored responses under its quota, atomically across every gateway.
-- All keys share the tenant's hash tag (one Redis Cluster slot).
-- KEYS[1] the tenant's expiry index: a ZSET, response id -> its expiry (ms, Redis's clock)
-- KEYS[2] the tenant's sizes: a HASH, response id -> the bytes it counts for
-- KEYS[3] the tenant's total: a STRING, the bytes of the responses in the index
-- KEYS[4] the response's own key (save, delete; any key of the tag for `room`)
-- ARGV[1] the operation: 'room', 'save' or 'delete'
--   room:   ARGV[2] max bytes, ARGV[3] max count, ARGV[4] the bytes one more would need
--   save:   ARGV[2] max bytes, ARGV[3] max count, ARGV[4] the id, ARGV[5] the value,
--           ARGV[6] its TTL in ms, ARGV[7] the bytes it counts for
--   delete: ARGV[2] the id, ARGV[3] its owner's header ('' for any owner)
-- Every call first forgets (up to PRUNE of) the responses whose expiry has passed: their
-- keys expired with them (the same TTL from the same clock), their room comes back.
-- Returns {status, quota, bytes, count}: status 1 done, 0 refused (`quota` names the cap:
-- 'bytes' or 'count') or, for delete, nothing deleted; bytes and count after the call.
-- Requires Redis >= 5 (scripts replicated by their effects, so TIME is allowed).
local PRUNE = 1000
-- The bookkeeping keys outlive the last response by this much, then expire with it.
local MARGIN_MS = 60000

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local total = tonumber(redis.call('GET', KEYS[3]) or '0')
-- The total moves by INCRBY, which keeps the key's TTL.
local function add(delta)
  if delta ~= 0 then
    total = redis.call('INCRBY', KEYS[3], delta)
  end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now, 'LIMIT', 0, PRUNE)
if #expired > 0 then
  local sizes = redis.call('HMGET', KEYS[2], unpack(expired))
  local freed = 0
  for i = 1, #expired do
    freed = freed + (tonumber(sizes[i]) or 0)
  end
  redis.call('ZREM', KEYS[1], unpack(expired))
  redis.call('HDEL', KEYS[2], unpack(expired))
  add(-freed)
end
local count = redis.call('ZCARD', KEYS[1])
local op = ARGV[1]

-- Forget one response of the index (its key is the caller's business).
local function forget(id)
  local size = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  if redis.call('ZREM', KEYS[1], id) == 1 then
    count = count - 1
  end
  redis.call('HDEL', KEYS[2], id)
  add(-size)
end

if op == 'room' then
  local max_bytes, max_count, need = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  if total + need > max_bytes then return {0, 'bytes', total, count} end
  if count >= max_count then return {0, 'count', total, count} end
  return {1, '', total, count}
end

if op == 'save' then
  local max_bytes, max_count = tonumber(ARGV[2]), tonumber(ARGV[3])
  local id, ttl, size = ARGV[4], tonumber(ARGV[6]), tonumber(ARGV[7])
  -- The same id again (ids are random: not expected) replaces what it counted for.
  local old = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  local number = count + 1
  if redis.call('ZSCORE', KEYS[1], id) then
    number = count
  end
  if total - old + size > max_bytes then return {0, 'bytes', total, count} end
  if number > max_count then return {0, 'count', total, count} end
  redis.call('SET', KEYS[4], ARGV[5], 'PX', ttl)
  redis.call('ZADD', KEYS[1], now + ttl, id)
  redis.call('HSET', KEYS[2], id, size)
  add(size - old)
  count = number
  local keep = ttl + MARGIN_MS
  for i = 1, 3 do
    if redis.call('PTTL', KEYS[i]) < keep then
      redis.call('PEXPIRE', KEYS[i], keep)
    end
  end
  return {1, '', total, count}
end

if op == 'delete' then
  local id, owner = ARGV[2], ARGV[3]
  local value = redis.call('GET', KEYS[4])
  if not value then return {0, '', total, count} end
  if owner ~= '' and string.sub(value, 1, #owner) ~= owner then
    return {0, '', total, count}
  end
  redis.call('DEL', KEYS[4])
  forget(id)
  return {1, '', total, count}
end

return redis.error_reply('unknown operation ' .. tostring(op))
