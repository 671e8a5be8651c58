-- Idempotency-Key: forget a run that failed, so the client's retry runs again.
-- KEYS[1]: the record. Deletes it if it is an in-progress marker (never a response).
local record = redis.call('GET', KEYS[1])
if record and string.sub(record, 1, 1) == 'R' then
    return redis.call('DEL', KEYS[1])
end
return 0
