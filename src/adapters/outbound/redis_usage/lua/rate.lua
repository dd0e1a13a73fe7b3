-- The rate scripts' common part (after `clock.lua`, before `take_request`,
-- `reserve_tokens` or `settle`): the consumer's buckets and day window, refilled to now,
-- `store` to write them back and `reply`. The scripts compute exactly what
-- `domain.rate_limits` computes (same integer units, same order of steps) and reply with
-- the state after the step, so the domain code derives the snapshot and Retry-After.
--
-- KEYS: the rate hash (fields r, t: bucket levels in 1/60000 token; s: their stamp in ms;
-- d: UTC day of u: tokens used that day). ARGV: now, rpm, tpm, tpd ('' = no such limit);
-- then the script's own.

local key = KEYS[1]
local rpm, tpm, tpd = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local S, DAY = 60000, 86400000
local f = redis.call('HMGET', key, 'r', 't', 's', 'd', 'u')
local stamp = tonumber(f[3]) or 0
local elapsed = math.max(0, now - stamp)
local function refill(level, limit)
  if not limit then return nil end
  if not level then return limit * S end
  return math.min(limit * S, level + elapsed * limit)
end
local r, tk = refill(tonumber(f[1]), rpm), refill(tonumber(f[2]), tpm)
stamp = math.max(stamp, now)
local today = math.floor(now / DAY)
local day, used = tonumber(f[4]) or -1, tonumber(f[5]) or 0
if day ~= today then day, used = today, 0 end

local function int(x) return string.format('%d', x) end

-- Write the state back with a TTL of "until it equals a fresh one" (full buckets, nothing
-- used today): an idle consumer leaves nothing behind.
local function store()
  local idle = 0
  if r then idle = math.max(idle, math.ceil((rpm * S - r) / rpm)) end
  if tk then idle = math.max(idle, math.ceil((tpm * S - tk) / tpm)) end
  if tpd and used > 0 then idle = math.max(idle, DAY - now % DAY) end
  redis.call('DEL', key)
  if idle <= 0 then return end
  local fields = {'s', int(stamp), 'd', int(day), 'u', int(used)}
  if r then fields[#fields + 1] = 'r'; fields[#fields + 1] = int(r) end
  if tk then fields[#fields + 1] = 't'; fields[#fields + 1] = int(tk) end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, idle)
end

local function reply(code) return {code, now, r or 0, tk or 0, day, used} end
