-- Idempotency-Key: replace an in-progress marker by the response.
-- KEYS[1]: the record. ARGV[1]: meta "\n" body, ARGV[2]: TTL in ms.
-- Returns 0 if there was no marker (it expired, or was abandoned), else 1.
local record = redis.call('GET', KEYS[1])
if not record or string.sub(record, 1, 1) ~= 'R' then
    return 0
end
redis.call('SET', KEYS[1], 'D' .. string.sub(record, 2) .. '\n' .. ARGV[1], 'PX', ARGV[2])
return 1
