-- The slot scripts' common part (after `clock.lua`, before `acquire`, `release` or
-- `renew`). KEYS: the held sorted set (token -> lease expiry, ms). Drops lapsed leases;
-- `keep` then keeps the key alive exactly as long as its longest lease.

local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local function keep()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then redis.call('PEXPIRE', key, tonumber(last[2]) - now) end
end
