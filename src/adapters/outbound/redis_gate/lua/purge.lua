-- purge: nothing after the owner. Remove an owner and everything it holds (graceful
-- close, or the old identity of a fenced process), then hand the freed slots on.

redis.call('ZREM', O, owner)
local n = 0
local held = redis.call('HGETALL', S)
for i = 1, #held, 2 do
  if held[i + 1] == owner then free(held[i]); n = n + 1 end
end
local waiting = redis.call('HGETALL', W)
for i = 1, #waiting, 2 do
  if waiting[i + 1] == owner then drop_waiter(waiting[i]); n = n + 1 end
end
local r = maintain()
return reply(n, 0, r)
