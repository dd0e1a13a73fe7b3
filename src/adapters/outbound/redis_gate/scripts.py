"""The server-side Lua scripts of the Redis admission ledger, and the key layout.

Every state change of an upstream's ledger is ONE script, so it is atomic across all
gateway processes: no WATCH/MULTI retry loops, no window between "read the count" and
"take the slot". Every script starts with the same `maintain()` step, so whichever
process touches the ledger first repairs it:

1. `reclaim`: owners whose heartbeat lease has passed (score <= server time in the
   owners sorted set) lose their slots and queue entries (bounded: 32 owners a call);
2. `expire`: queue entries past their deadline leave the queue (at most 128 a call);
3. `promote`: while a slot is free, the queue head takes it (FIFO by sequence number),
   and the promoted tokens are PUBLISHed on the upstream's wake channel.

All times come from the Redis server's `TIME`, so the processes' clocks never have to
agree. Redis >= 5 replicates script effects, which makes `TIME` in a writing script safe.

Result of every per-upstream script: `{code, value, in_use, queued, reclaimed, stamp}`;
`in_use`/`queued` feed the gate's snapshot cache, `reclaimed` its metrics. `stamp` (server
time in microseconds; scripts run one at a time) orders replies that arrive over
different pooled connections, so an older count never overwrites a newer one.
"""

from __future__ import annotations

# Result codes shared by the scripts (first element of the reply).
FENCED = -1  # the calling owner's lease has expired (or it was reclaimed): it is fenced
REJECTED = 0  # enter: queue full  | poll/cancel: the token is nowhere (ended)
ADMITTED = 1  # enter: slot taken  | poll: the token holds a slot  | cancel: withdrawn
QUEUED = 2  # enter: queued      | poll: still queued, value = 1-based position
WITHDRAWN = 1  # cancel: the token was queued and has left the queue
HOLDS = 2  # cancel: the token holds a slot (timeout mode keeps it)
GAVE_BACK = 3  # cancel: the token held a slot and gave it back (cancel mode)

KEY_NAMES = ("queue", "deadlines", "waiters", "slots", "owners", "seq")


def upstream_keys(prefix: str, upstream: str) -> tuple[list[str], str]:
    """The six keys and the wake channel of one upstream.

    `{upstream}` is a Redis Cluster hash tag: one upstream's keys live in one slot, so
    its scripts also run on a cluster; different upstreams may live on different nodes.
    """
    base = f"{prefix}:{{{upstream}}}"
    return [f"{base}:{name}" for name in KEY_NAMES], f"{base}:wake"


_PRELUDE = """
local Q, D, W, S, O, SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local cap, channel, owner = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function drop_waiter(token)
  redis.call('ZREM', Q, token)
  redis.call('ZREM', D, token)
  redis.call('HDEL', W, token)
end

local function reclaim()
  local dead = redis.call('ZRANGEBYSCORE', O, '-inf', now, 'LIMIT', 0, 32)
  if #dead == 0 then return 0 end
  local gone = {}
  for _, o in ipairs(dead) do gone[o] = true end
  redis.call('ZREM', O, unpack(dead))
  local n = 0
  local held = redis.call('HGETALL', S)
  for i = 1, #held, 2 do
    if gone[held[i + 1]] then redis.call('HDEL', S, held[i]); n = n + 1 end
  end
  local waiting = redis.call('HGETALL', W)
  for i = 1, #waiting, 2 do
    if gone[waiting[i + 1]] then drop_waiter(waiting[i]); n = n + 1 end
  end
  return n
end

local function expire()
  local lapsed = redis.call('ZRANGEBYSCORE', D, '-inf', now, 'LIMIT', 0, 128)
  if #lapsed > 0 then
    redis.call('ZREM', Q, unpack(lapsed))
    redis.call('ZREM', D, unpack(lapsed))
    redis.call('HDEL', W, unpack(lapsed))
  end
end

local function promote()
  local free = cap - redis.call('HLEN', S)
  if free <= 0 then return end
  local heads = redis.call('ZRANGE', Q, 0, free - 1)
  if #heads == 0 then return end
  local granted = {}
  for _, token in ipairs(heads) do
    local who = redis.call('HGET', W, token)
    if who then redis.call('HSET', S, token, who); granted[#granted + 1] = token end
    drop_waiter(token)
  end
  if #granted > 0 then redis.call('PUBLISH', channel, table.concat(granted, ' ')) end
end

local function alive()
  local expiry = redis.call('ZSCORE', O, owner)
  return expiry ~= false and expiry ~= nil and tonumber(expiry) > now
end

local function maintain()
  local n = reclaim()
  expire()
  promote()
  return n
end

local function reply(code, value, n)
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return {code, value, redis.call('HLEN', S), redis.call('ZCARD', Q), n, stamp}
end
"""

# ARGV: cap, channel, owner, token, depth, timeout_ms. Idempotent per token, so a retried
# call (lost reply) reports the token's state instead of queueing it twice.
ENTER = _PRELUDE + """
local token, depth, timeout_ms = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local n = maintain()
if redis.call('HGET', S, token) == owner then return reply(1, 0, n) end
local rank = redis.call('ZRANK', Q, token)
if rank then return reply(2, rank + 1, n) end
if not alive() then return reply(-1, 0, n) end
local held, waiting = redis.call('HLEN', S), redis.call('ZCARD', Q)
if held < cap and waiting == 0 then
  redis.call('HSET', S, token, owner)
  return reply(1, 0, n)
end
if waiting >= depth then return reply(0, 0, n) end
local seq = redis.call('INCR', SEQ)
redis.call('ZADD', Q, seq, token)
redis.call('ZADD', D, now + timeout_ms, token)
redis.call('HSET', W, token, owner)
return reply(2, waiting + 1, n)
"""

# ARGV: cap, channel, owner, token. Only the owner's own slot is freed: a fenced owner's
# late release is a no-op, its slot already belongs to somebody else.
RELEASE = _PRELUDE + """
local released = 0
if redis.call('HGET', S, ARGV[4]) == owner then
  redis.call('HDEL', S, ARGV[4])
  released = 1
end
local n = maintain()
return reply(released, 0, n)
"""

# ARGV: cap, channel, owner, token, mode. mode 'cancel' (hang-up, drain, forget): leave
# the queue, or give back a slot granted in the same instant. mode 'timeout' (the local
# queue deadline): leave the queue, but keep a slot granted just before the deadline.
CANCEL = _PRELUDE + """
local token = ARGV[4]
local n = maintain()
local code = 0
if redis.call('HGET', W, token) == owner then
  drop_waiter(token)
  code = 1
elseif redis.call('HGET', S, token) == owner then
  code = 2
  if ARGV[5] == 'cancel' then
    redis.call('HDEL', S, token)
    code = 3
    promote()
  end
end
return reply(code, 0, n)
"""

# ARGV: cap, channel, owner, token. One wait() round: repair, then where is my token?
POLL = _PRELUDE + """
local token = ARGV[4]
local n = maintain()
if redis.call('HGET', S, token) == owner then return reply(1, 0, n) end
local rank = redis.call('ZRANK', Q, token)
if rank and redis.call('HGET', W, token) == owner then return reply(2, rank + 1, n) end
if not alive() then return reply(-1, 0, n) end
return reply(0, 0, n)
"""

# ARGV: cap, channel, owner (unused). The snapshot refresher's call: repair and count.
MAINTAIN = _PRELUDE + """
local n = maintain()
return reply(0, 0, n)
"""

# ARGV: cap, channel, owner, lease_ms, register. register=1 announces a new owner id;
# otherwise the lease is renewed only if it has not expired: an expired owner may have
# lost its slots to `reclaim` already, so it must learn it is fenced instead.
HEARTBEAT = _PRELUDE + """
local lease_ms = tonumber(ARGV[4])
if ARGV[5] == '1' then
  redis.call('ZADD', O, now + lease_ms, owner)
  return reply(1, 0, 0)
end
if not alive() then return reply(-1, 0, 0) end
redis.call('ZADD', O, 'XX', now + lease_ms, owner)
return reply(1, 0, 0)
"""

# ARGV: cap, channel, owner. Remove an owner and everything it holds (graceful close,
# or the old identity of a fenced process), then hand the freed slots on.
PURGE = _PRELUDE + """
redis.call('ZREM', O, owner)
local n = 0
local held = redis.call('HGETALL', S)
for i = 1, #held, 2 do
  if held[i + 1] == owner then redis.call('HDEL', S, held[i]); n = n + 1 end
end
local waiting = redis.call('HGETALL', W)
for i = 1, #waiting, 2 do
  if waiting[i + 1] == owner then drop_waiter(waiting[i]); n = n + 1 end
end
local r = maintain()
return reply(n, 0, r)
"""

ALL = {
    "enter": ENTER, "release": RELEASE, "cancel": CANCEL, "poll": POLL,
    "maintain": MAINTAIN, "heartbeat": HEARTBEAT, "purge": PURGE,
}
