-- move: ARGV after the owner: token, from (the replica the caller's lease names). The one
-- safe retry: the held token's k slots move from its replica to the one `pick` chooses
-- among the OTHER pickable replicas (eligible, not saturated, k free), in one step:
-- `bound` and both `replicas` counts change together, the slots in use never do. Then
-- promote: the room left on the old replica may admit the queue head. Reply code 1
-- (moved; replica = the new one), 0 (not moved: no other replica has room, no replicas,
-- or the token is not held: released or reclaimed) or -1 (the caller is fenced).
-- Idempotent per (token, from): a retried call whose first run moved the token already
-- (the bound replica is no longer `from`) replies 1 with the replica it is on, and moves
-- nothing.

local token, from = ARGV[7], ARGV[8]
local n = maintain()
if redis.call('HGET', S, token) ~= owner then
  if not alive() then return reply(-1, 0, n) end
  return reply(0, 0, n)
end
local k, addr = bound_of(token)
if addr == '' then return reply(0, 0, n) end
if addr ~= from then return reply(1, 0, n, addr) end
local target = pick(k, nil, 0, addr)
if not target then return reply(0, 0, n) end
redis.call('HINCRBY', R, target, k)
if redis.call('HINCRBY', R, addr, -k) <= 0 then redis.call('HDEL', R, addr) end
redis.call('SET', LAST, target)
redis.call('HSET', BOUND, token, k .. ' ' .. target)
promote()
return reply(1, 0, n, target)
