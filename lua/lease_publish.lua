-- Publish the placement, unless a leader with a newer fencing token already has: a leader
-- that stalled between its fence check and this write cannot overwrite its successor's.
-- KEYS[1] the published placement (JSON with a `token`); ARGV[1] our token, ARGV[2] the
-- placement. Returns 1 when written, 0 when a newer one is there.
local current = redis.call('GET', KEYS[1])
if current then
  local ok, decoded = pcall(cjson.decode, current)
  if ok and type(decoded) == 'table' and tonumber(decoded['token'] or 0) > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
