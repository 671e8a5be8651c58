-- Write a managed key's record if it is still the one the change was made from
-- (compare-and-set): two changes to one key at once cannot undo each other, so a PATCH
-- racing a revoke cannot bring the key back, nor one racing a rotate keep the old secret.
-- KEYS[1] the records hash, KEYS[2] the by-hash index, KEYS[3] the change counter.
-- ARGV[1] the key id; ARGV[2] the record read before the change ('' for a new key);
-- ARGV[3] the new record; ARGV[4] its key's digest; ARGV[5] a digest to drop ('' for none).
-- Returns 1 if written, 0 if the record changed meanwhile (the caller reads it again).
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  if stored then return 0 end
elseif stored ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[1])
if ARGV[5] ~= '' then
  redis.call('HDEL', KEYS[2], ARGV[5])
end
redis.call('INCR', KEYS[3])
return 1
