-- poll: ARGV after the owner: token. One wait() round: repair, then where is my token?

local token = ARGV[7]
local n = maintain()
if redis.call('HGET', S, token) == owner then
  local _, addr = bound_of(token)
  return reply(1, 0, n, addr)
end
local rank = position(token)
if rank and redis.call('HGET', W, token) == owner then return reply(2, rank, n) end
if not alive() then return reply(-1, 0, n) end
return reply(0, 0, n)
