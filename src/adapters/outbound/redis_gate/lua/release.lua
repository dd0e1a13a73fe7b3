-- release: ARGV after the owner: token. Only the owner's own slots are freed (all k of
-- them, and its replica's): a fenced owner's late release is a no-op, its slots belong to
-- somebody else.

local released = 0
if redis.call('HGET', S, ARGV[7]) == owner then
  free(ARGV[7])
  released = 1
end
local n = maintain()
return reply(released, 0, n)
