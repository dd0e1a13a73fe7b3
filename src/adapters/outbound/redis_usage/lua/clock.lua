-- The part every consumer-counter script starts with (scripts.py prepends this file to
-- `rate.lua` or `held.lua`, then to the script's own file): `now`, in ms.
--
-- Time is Redis `TIME` (one clock for every process) unless ARGV[1] carries a time in ms
-- (tests drive the scripts with a fake clock through that; the gateway never does).

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
