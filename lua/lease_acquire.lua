-- Take or renew the placement lease.
-- KEYS[1] the lease ("<holder> <token>", expiring), KEYS[2] the fencing-token counter
-- ARGV[1] the candidate's id, ARGV[2] the lease's time to live in ms
-- Returns the holder's fencing token when the candidate holds the lease (taken now, or
-- renewed), else 0. A new holder gets a token greater than every earlier one.
local current = redis.call('GET', KEYS[1])
if current then
  local holder, token = string.match(current, '^(.*) (%d+)$')
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(token)
  end
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
return token
