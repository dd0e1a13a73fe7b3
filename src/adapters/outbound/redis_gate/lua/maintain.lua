-- maintain: nothing after the owner (unused). The snapshot refresher's call (and
-- `set_replicas`' wake-up, with the new view): repair, promote, count.

local n = maintain()
return reply(0, 0, n)
