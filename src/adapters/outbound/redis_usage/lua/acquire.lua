-- acquire: ARGV: now, max_in_flight, token, lease_ms. Reply {granted 1|0, holders}.
-- Idempotent per token (a retried call after a lost reply does not take a second slot).

local cap, token, lease = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('ZSCORE', key, token) then return {1, redis.call('ZCARD', key)} end
local n = redis.call('ZCARD', key)
if n >= cap then return {0, n} end
redis.call('ZADD', key, now + lease, token)
keep()
return {1, n + 1}
