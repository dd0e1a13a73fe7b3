-- heartbeat: ARGV after the owner: lease_ms, register. register=1 announces a new owner
-- id; otherwise the lease is renewed only if it has not expired: an expired owner may
-- have lost its slots to `reclaim` already, so it must learn it is fenced instead.

local lease_ms = tonumber(ARGV[7])
if ARGV[8] == '1' then
  redis.call('ZADD', O, now + lease_ms, owner)
  return reply(1, 0, 0)
end
if not alive() then return reply(-1, 0, 0) end
redis.call('ZADD', O, 'XX', now + lease_ms, owner)
return reply(1, 0, 0)
