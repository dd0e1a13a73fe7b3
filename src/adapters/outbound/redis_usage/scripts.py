"""The Lua scripts of the Redis consumer counters, and their key layout.

Each operation is ONE script, so "check and take" is atomic across all gateway processes:
one request (`TAKE_REQUEST`, before the body is read) or a token estimate in every token
limit (`RESERVE_TOKENS`, after decoding). The rate scripts compute exactly what `domain.rate_limits` computes
(same integer units, same order of steps) and reply with the state after the step, so
the snapshot and Retry-After are derived by the domain code itself, never twice.

Time is Redis `TIME` (one clock for every replica) unless ARGV[1] carries a time in ms
(tests drive the scripts with a fake clock through that; the gateway never does).
"""

from __future__ import annotations

CHANNEL = "consumers:free"  # under the prefix: the name of a consumer whose slot was released


def rate_key(prefix: str, consumer: str) -> str:
    """`{consumer:NAME}` is a Redis Cluster hash tag: one consumer's keys share a slot."""
    return f"{prefix}:{{consumer:{consumer}}}:rate"


def held_key(prefix: str, consumer: str) -> str:
    return f"{prefix}:{{consumer:{consumer}}}:held"


_CLOCK = """
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
"""

# KEYS: the rate hash (fields r, t: bucket levels in 1/60000 token; s: their stamp in ms;
# d: UTC day of u: tokens used that day). ARGV: now, rpm, tpm, tpd ('' = no such limit).
_RATE = _CLOCK + """
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
"""

# One request of requests_per_minute, before the body is read. Reply {admitted 1|0, now, r,
# t, day, used}: the state after taking it, or as it is (nothing taken) when refused.
TAKE_REQUEST = _RATE + """
if r and r < S then return reply(0) end
if r then r = r - S end
store()
return reply(1)
"""

# ARGV[5]: tokens (the estimate, >= 0), reserved in every token limit or in none. Reply as
# TAKE_REQUEST's.
RESERVE_TOKENS = _RATE + """
local tokens = tonumber(ARGV[5])
if (tk and tk < math.min(tokens, tpm) * S) or (tpd and used + math.min(tokens, tpd) > tpd) then
  return reply(0)
end
if tk then tk = tk - tokens * S end
if tpd then used = used + tokens end
store()
return reply(1)
"""

# ARGV[5..8]: reserved, actual, charged to the bucket (1|0), UTC day charged (-1 = none).
SETTLE = _RATE + """
local diff = tonumber(ARGV[6]) - tonumber(ARGV[5])
if tk and ARGV[7] == '1' then tk = math.min(tpm * S, tk - diff * S) end
if tpd and tonumber(ARGV[8]) == day then used = math.max(0, used + diff) end
store()
return reply(1)
"""

# KEYS: the held sorted set (token -> lease expiry, ms). Drops lapsed leases, then keeps
# the key alive exactly as long as its longest lease.
_HELD = _CLOCK + """
local key = KEYS[1]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local function keep()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then redis.call('PEXPIRE', key, tonumber(last[2]) - now) end
end
"""

# ARGV: now, max_in_flight, token, lease_ms. Reply {granted 1|0, holders}. Idempotent per
# token (a retried call after a lost reply does not take a second slot).
ACQUIRE = _HELD + """
local cap, token, lease = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('ZSCORE', key, token) then return {1, redis.call('ZCARD', key)} end
local n = redis.call('ZCARD', key)
if n >= cap then return {0, n} end
redis.call('ZADD', key, now + lease, token)
keep()
return {1, n + 1}
"""

# ARGV: now, token, channel, consumer name. Reply {released 1|0, holders}; a release
# PUBLISHes the consumer's name so waiters in every process try again at once.
RELEASE = _HELD + """
local removed = redis.call('ZREM', key, ARGV[2])
if removed == 1 then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return {removed, redis.call('ZCARD', key)}
"""

# ARGV: now, lease_ms, tokens... Renews this process's leases; a token already gone (its
# lease lapsed: the process was paused or cut off longer than the lease) is not revived.
# Reply {missing, holders}.
RENEW = _HELD + """
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
"""
