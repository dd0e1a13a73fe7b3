-- settle: ARGV[5..8]: reserved, actual, charged to the bucket (1|0), UTC day charged (-1 =
-- none). Reply as take_request's, always admitted.

local diff = tonumber(ARGV[6]) - tonumber(ARGV[5])
if tk and ARGV[7] == '1' then tk = math.min(tpm * S, tk - diff * S) end
if tpd and tonumber(ARGV[8]) == day then used = math.max(0, used + diff) end
store()
return reply(1)
