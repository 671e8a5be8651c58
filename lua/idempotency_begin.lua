-- Idempotency-Key: start a run, or find the record of an earlier one.
-- KEYS[1]: the record. ARGV[1]: the in-progress marker, ARGV[2]: its TTL in ms.
-- Returns nil when the marker was set (a fresh run), else the record found.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return false
end
return redis.call('GET', KEYS[1])
