-- renew: ARGV: now, lease_ms, tokens... Renews this process's leases; a token already gone
-- (its lease lapsed: the process was paused or cut off longer than the lease) is not
-- revived. Reply {missing, holders}.

local lease, missing = tonumber(ARGV[2]), 0
for i = 3, #ARGV do
  if redis.call('ZSCORE', key, ARGV[i]) then
    redis.call('ZADD', key, 'XX', now + lease, ARGV[i])
  else
    missing = missing + 1
  end
end
keep()
return {missing, redis.call('ZCARD', key)}
