-- Give the lease up, if this holder still holds it under this token (a stopping leader:
-- another takes over at once instead of after the lease's time to live).
-- KEYS[1] the lease; ARGV[1] the holder's id, ARGV[2] its token. Returns 1 if released.
if redis.call('GET', KEYS[1]) == ARGV[1] .. ' ' .. ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
