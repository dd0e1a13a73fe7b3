-- take_request: no ARGV of its own. One request of requests_per_minute, before the body is
-- read. Reply {admitted 1|0, now, r, t, day, used}: the state after taking it, or as it is
-- (nothing taken) when refused.

if r and r < S then return reply(0) end
if r then r = r - S end
store()
return reply(1)
