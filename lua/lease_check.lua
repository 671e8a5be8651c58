-- Whether the lease is still held by this holder under this fencing token.
-- KEYS[1] the lease; ARGV[1] the holder's id, ARGV[2] its token. Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] .. ' ' .. ARGV[2] then
  return 1
end
return 0
