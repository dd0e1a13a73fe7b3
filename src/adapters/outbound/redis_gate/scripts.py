"""The server-side Lua scripts of the Redis admission ledger, and the key layout.

Every state change of an upstream's ledger is ONE script, so it is atomic across all
gateway processes: no WATCH/MULTI retry loops, no window between "read the count" and
"take the slot". Every script starts with the same `maintain()` step, so whichever
process touches the ledger first repairs it:

1. `reclaim`: owners whose heartbeat lease has passed (score <= server time in the
   owners sorted set) lose their slots and queue entries (bounded: 32 owners a call);
2. `expire`: queue entries past their deadline leave the queue (at most 128 a call);
3. `promote`: while the queue head fits, it takes its slots (FIFO by sequence number, or
   the fair order), and the promoted tokens are PUBLISHed on the upstream's wake channel.
   Head-of-line: a head that does not fit (a request for k slots, k > the free ones, or no
   ready replica with k free) stops the promotion; nobody behind it is admitted first.

Sequences (issue 19): a request takes k >= 1 slots. The slots in use are HLEN(slots) plus
`extra` (the sum of k - 1 over held tokens with k > 1); a queued token with k > 1 has its
k in `want`, a held one in `bound`. Replicas (issue 20): an upstream with `[endpoints]`
passes its per-replica cap and the calling process's ready replicas (its discovery view)
in every call; a token is admitted when used + k <= min(cap, ready x per-replica cap) AND
one ready replica has k free, and it is bound, in the same script, to the replica
`domain.replicas.pick` would choose: the fewest slots in flight, ties rotate after the
last one picked (`last`), addresses compared bytewise. `replicas` holds every replica's
slots in flight, shared by all processes; `bound` holds a held token's "<k> <replica>", so
every release path (release, cancel, reclaim of a dead owner, purge) gives back exactly
its k and its replica's k. An upstream without replicas and a request for one slot write
none of these keys: exactly what the ledger always wrote.

All times come from the Redis server's `TIME`, so the processes' clocks never have to
agree. Redis >= 5 replicates script effects, which makes `TIME` in a writing script safe.

Result of every per-upstream script: `{code, value, in_use, queued, reclaimed, stamp,
replica, replica_counts, by_priority}`; `in_use` (slots)/`queued` feed the gate's snapshot cache,
`reclaimed` its metrics. `stamp` (server time in microseconds; scripts run one at a time)
orders replies that arrive over different pooled connections, so an older count never
overwrites a newer one. `replica`: the replica the token is bound to when the code says it
holds slots ('' otherwise, or without replicas); `replica_counts`: the flat HGETALL of
`replicas` (empty without replicas), for the gate's `replicas()` view; `by_priority`: the
flat HGETALL of `by_priority` (waiting requests per consumer priority other than 0; the
rest of `queued` is priority 0), for the snapshot's `queued_by_priority`.

Every script's ARGV starts with the same four: cap, channel, per-replica cap (0: no
replicas), the caller's eligible replicas (ready and not ejected: they hold the live cap;
space-separated, the saturated ones, in the cap but never picked, after a lone "|"); then
the owner, then its own. Issue 23: an ejected replica is thus, inside the scripts, one the
caller does not see (the gate still reports it EJECTED); `enter` takes the arriving
request's affinity (`prefer`, `max_extra`) for its own pick only; `move` is the one safe
retry's lease move.
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

KEY_NAMES = (
    "queue", "deadlines", "waiters", "slots", "owners", "seq",
    "fair", "entries", "counts", "vtime", "tags",  # fair mode / max_queued_per_consumer
    "want", "bound", "extra", "replicas", "last",  # k slots per request / replicas
    "priorities", "by_priority",  # queued requests of consumers with a priority other than 0
)
# A band's tags are forgotten once its queue has been empty this long past the newest
# deadline (only a cancelled request's unserved tag can outlive the queue: see `normalize`).
TAGS_GRACE_MS = 60_000
_COMPLEMENT = str.maketrans("0123456789", "9876543210")


def band(priority: int) -> str:
    """An order-preserving string for -priority (any int): higher priority sorts first.

    "p" + 2-digit length + digits for -priority >= 0; "n" + (99 - length) + complemented
    digits below 0. Never contains ":" or " ", which the fair queue's members rely on.
    """
    inverse = -priority
    digits = str(abs(inverse))
    if inverse >= 0:
        return f"p{len(digits):02d}{digits}"
    return f"n{99 - len(digits):02d}{digits.translate(_COMPLEMENT)}"


def upstream_keys(prefix: str, upstream: str) -> tuple[list[str], str]:
    """The eighteen keys and the wake channel of one upstream.

    `{upstream}` is a Redis Cluster hash tag: one upstream's keys live in one slot, so
    its scripts also run on a cluster; different upstreams may live on different nodes.
    """
    base = f"{prefix}:{{{upstream}}}"
    return [f"{base}:{name}" for name in KEY_NAMES], f"{base}:wake"


_PRELUDE = """
local Q, D, W, S, O, SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local F, E, N, VT, TG = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local WANT, BOUND, EXTRA, R, LAST = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local PRI, BYP = KEYS[17], KEYS[18]
local cap, channel, rlimit, owner = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[5]
-- ARGV[4]: the caller's eligible replicas (ready and not ejected: they hold the live cap),
-- "<pickable...> | <saturated...>": those after a lone '|' (never an address) are full by
-- their own metrics: they count in the cap but get no request
local ready, pickable = {}, {}
if rlimit > 0 then
  local saturated = false
  for a in string.gmatch(ARGV[4], '%S+') do
    if a == '|' then saturated = true
    else
      ready[#ready + 1] = a
      if not saturated then pickable[#pickable + 1] = a end
    end
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- slots in use: one per held token, plus k - 1 for each held token taking k > 1
local function used()
  return redis.call('HLEN', S) + (tonumber(redis.call('GET', EXTRA)) or 0)
end

local function live_cap()
  if rlimit == 0 then return cap end
  return math.min(cap, #ready * rlimit)
end

-- a < b, byte by byte (Lua's own `<` follows the server's locale)
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- domain.replicas.pick: among the pickable replicas (never `avoid`) with k free, the fewest
-- in flight; ties go to the first address after the last one picked (wrapping). `prefer`
-- (affinity, best first): the first of them with k free whose in flight is within
-- `max_extra` of that least wins. '' without replicas, nil when none has room.
local function pick(k, prefer, max_extra, avoid)
  if rlimit == 0 then return '' end
  local best, least, room = {}, nil, {}
  for _, a in ipairs(pickable) do
    if a ~= avoid then
      local n = tonumber(redis.call('HGET', R, a)) or 0
      if rlimit - n >= k then
        room[a] = n
        if least == nil or n < least then best, least = {a}, n
        elseif n == least then best[#best + 1] = a end
      end
    end
  end
  if #best == 0 then return nil end
  if prefer then
    for _, a in ipairs(prefer) do
      local n = room[a]
      if n ~= nil and n <= least + max_extra then return a end
    end
  end
  local last = redis.call('GET', LAST)
  local choice, wrap = nil, nil
  for _, a in ipairs(best) do
    if wrap == nil or before(a, wrap) then wrap = a end
    if last and before(last, a) and (choice == nil or before(a, choice)) then choice = a end
  end
  return choice or wrap
end

-- take k slots for a token (bound to the picked replica) if they fit; the replica
-- ('' without replicas), or nil: it does not fit now. `prefer`/`max_extra`: see `pick`.
local function take(token, who, k, prefer, max_extra)
  if used() + k > live_cap() then return nil end
  local addr = pick(k, prefer, max_extra)
  if not addr then return nil end
  redis.call('HSET', S, token, who)
  if k > 1 then redis.call('INCRBY', EXTRA, k - 1) end
  if addr ~= '' then
    redis.call('HINCRBY', R, addr, k)
    redis.call('SET', LAST, addr)
  end
  if k > 1 or addr ~= '' then redis.call('HSET', BOUND, token, k .. ' ' .. addr) end
  return addr
end

local function bound_of(token)
  local b = redis.call('HGET', BOUND, token)
  if not b then return 1, '' end
  local sp = string.find(b, ' ', 1, true)
  return tonumber(string.sub(b, 1, sp - 1)), string.sub(b, sp + 1)
end

-- give back every slot a held token holds, and its replica's
local function free(token)
  redis.call('HDEL', S, token)
  local k, addr = bound_of(token)
  if k == 1 and addr == '' then return end
  redis.call('HDEL', BOUND, token)
  if k > 1 and redis.call('DECRBY', EXTRA, k - 1) <= 0 then redis.call('DEL', EXTRA) end
  if addr ~= '' and redis.call('HINCRBY', R, addr, -k) <= 0 then redis.call('HDEL', R, addr) end
end

-- E: token -> "<fair member> <consumer>" (member '' in fifo with a per-consumer limit)
local function entry_of(token)
  local e = redis.call('HGET', E, token)
  if not e then return nil, nil end
  local sp = string.find(e, ' ', 1, true)
  return string.sub(e, 1, sp - 1), string.sub(e, sp + 1)
end

local function forget_entry(token)
  local member, consumer = entry_of(token)
  if not member then return end
  redis.call('HDEL', E, token)
  if member ~= '' then redis.call('ZREM', F, member) end
  if redis.call('HINCRBY', N, consumer, -1) <= 0 then redis.call('HDEL', N, consumer) end
end

-- a queued token of a consumer whose priority is not 0 leaves the per-priority counts
local function forget_priority(token)
  local p = redis.call('HGET', PRI, token)
  if not p then return end
  redis.call('HDEL', PRI, token)
  if redis.call('HINCRBY', BYP, p, -1) <= 0 then redis.call('HDEL', BYP, p) end
end

local function drop_waiter(token)
  redis.call('ZREM', Q, token)
  redis.call('ZREM', D, token)
  redis.call('HDEL', W, token)
  redis.call('HDEL', WANT, token)
  forget_priority(token)
  forget_entry(token)
end

-- 1-based place in dispatch order: in the fair order if the token has a fair member
local function position(token)
  local rank = redis.call('ZRANK', Q, token)
  if not rank then return nil end
  local member = entry_of(token)
  if member and member ~= '' then
    local r = redis.call('ZRANK', F, member)
    if r then return r + 1 end
  end
  return rank + 1
end

-- Once the fair queue is empty, shift every band's tags down by its virtual time: the
-- same future order (each band only compares tags among its own), and the state is
-- gone unless a consumer still has an unserved tag (a cancelled request's) above V.
local function normalize()
  if redis.call('EXISTS', VT) == 0 or redis.call('ZCARD', F) > 0 then return end
  local v = {}
  local vt = redis.call('HGETALL', VT)
  for i = 1, #vt, 2 do v[vt[i]] = tonumber(vt[i + 1]) end
  redis.call('DEL', VT)
  local tags = redis.call('HGETALL', TG)
  for i = 1, #tags, 2 do
    local base = v[string.match(tags[i], '^([^:]*):')]
    if base then
      local left = tonumber(tags[i + 1]) - base
      if left > 0 then redis.call('HSET', TG, tags[i], left) else redis.call('HDEL', TG, tags[i]) end
    end
  end
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
    if gone[held[i + 1]] then free(held[i]); n = n + 1 end
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
    redis.call('HDEL', WANT, unpack(lapsed))
    if redis.call('EXISTS', E) == 1 then
      for _, token in ipairs(lapsed) do forget_entry(token) end
    end
    if redis.call('EXISTS', PRI) == 1 then
      for _, token in ipairs(lapsed) do forget_priority(token) end
    end
  end
end

-- Free slots go to the smallest keys: the fair order F first (fair mode), then the
-- arrival order Q (fifo mode: F is empty, so this is exactly the fifo head). Head-of-line:
-- the first head that does not fit ends the round. A grant is published as the token,
-- or "<token>|<replica>" when it is bound to a replica.
local function promote(newcomer, prefer, max_extra)
  if used() >= live_cap() then return end
  local granted = {}
  while true do
    local token, member
    local head = redis.call('ZRANGE', F, 0, 0)
    if #head > 0 then
      member = head[1]
      token = string.match(member, '^[^:]*:%d+:%d+:(.+)$')
    else
      local rest = redis.call('ZRANGE', Q, 0, 0)
      if #rest == 0 then break end
      token = rest[1]
    end
    local who = redis.call('HGET', W, token)
    if who then
      local wish = token == newcomer and prefer or nil  -- affinity only for the arriving request
      local addr = take(token, who, tonumber(redis.call('HGET', WANT, token)) or 1, wish, max_extra)
      if not addr then break end
      granted[#granted + 1] = addr == '' and token or (token .. '|' .. addr)
    end
    if member then
      local b, tag = string.match(member, '^([^:]*):(%d+):')
      redis.call('ZREM', F, member)
      redis.call('HSET', VT, b, tonumber(tag))  -- V[band] = the dispatched finish tag
    end
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

local function reply(code, value, n, replica)
  normalize()
  local stamp = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local counts = {}
  if rlimit > 0 then counts = redis.call('HGETALL', R) end
  return {code, value, used(), redis.call('ZCARD', Q), n, stamp, replica or '', counts,
          redis.call('HGETALL', BYP)}
end
"""

# ARGV (after the common four and the owner): token, depth, timeout_ms, fair ('1'/'0'),
# consumer, band, step, limit (max_queued_per_consumer, 0 = none), tags_grace_ms, slots (k),
# the consumer's priority (counted per priority while queued; 0 is the rest of the queue),
# prefer (affinity: replicas best first, space-separated; '' for none) and max_extra: they
# weigh only in the pick of THIS request admitted at once (nobody waits, or a fair newcomer
# placed first); one promoted later goes to the least loaded. Idempotent per token, so a
# retried call (lost reply) reports the token's state instead of queueing it twice. With
# fair '0', limit 0, k 1 and no replicas (fifo, no per-consumer limit) it writes exactly
# what it always did.
ENTER = _PRELUDE + """
local token, depth, timeout_ms = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local fair, consumer, b, step = ARGV[9] == '1', ARGV[10], ARGV[11], tonumber(ARGV[12])
local limit, k, priority = tonumber(ARGV[13]), tonumber(ARGV[15]), ARGV[16]
local prefer, max_extra = {}, tonumber(ARGV[18]) or 0
for a in string.gmatch(ARGV[17] or '', '%S+') do prefer[#prefer + 1] = a end
local n = maintain()
if redis.call('HGET', S, token) == owner then
  local _, addr = bound_of(token)
  return reply(1, 0, n, addr)
end
local rank = position(token)
if rank then return reply(2, rank, n) end
if not alive() then return reply(-1, 0, n) end
local waiting = redis.call('ZCARD', Q)
if waiting == 0 then
  local addr = take(token, owner, k, prefer, max_extra)
  if addr then return reply(1, 0, n, addr) end
end
if waiting >= depth then return reply(0, 0, n) end
if limit > 0 and (tonumber(redis.call('HGET', N, consumer)) or 0) >= limit then
  return reply(0, 0, n)
end
local seq = redis.call('INCR', SEQ)
redis.call('ZADD', Q, seq, token)
redis.call('ZADD', D, now + timeout_ms, token)
redis.call('HSET', W, token, owner)
if k > 1 then redis.call('HSET', WANT, token, k) end
if priority ~= '0' then
  redis.call('HSET', PRI, token, priority)
  redis.call('HINCRBY', BYP, priority, 1)
end
if not fair and limit == 0 then return reply(2, waiting + 1, n) end
local member, place = '', waiting + 1
if fair then  -- start = max(V[band], last[band][consumer]); finish = start + step
  local field = b .. ':' .. consumer
  local start = math.max(tonumber(redis.call('HGET', VT, b)) or 0,
                         tonumber(redis.call('HGET', TG, field)) or 0)
  local finish = start + step
  redis.call('HSET', TG, field, finish)
  redis.call('PEXPIRE', TG, timeout_ms + tonumber(ARGV[14]))
  member = string.format('%s:%016d:%016d:%s', b, finish, seq, token)
  redis.call('ZADD', F, 0, member)
  place = redis.call('ZRANK', F, member) + 1
end
redis.call('HSET', E, token, member .. ' ' .. consumer)
redis.call('HINCRBY', N, consumer, 1)
if place == 1 then  -- placed ahead of a head that does not fit: it may go in at once
  promote(token, prefer, max_extra)
  if redis.call('HGET', S, token) == owner then
    local _, addr = bound_of(token)
    return reply(1, 0, n, addr)
  end
end
return reply(2, place, n)
"""

# ARGV: ..., owner, token. Only the owner's own slots are freed (all k of them, and its
# replica's): a fenced owner's late release is a no-op, its slots belong to somebody else.
RELEASE = _PRELUDE + """
local released = 0
if redis.call('HGET', S, ARGV[6]) == owner then
  free(ARGV[6])
  released = 1
end
local n = maintain()
return reply(released, 0, n)
"""

# ARGV: ..., owner, token, mode. mode 'cancel' (hang-up, drain, forget): leave the queue,
# or give back the slots granted in the same instant. mode 'timeout' (the local queue
# deadline): leave the queue, but keep slots granted just before the deadline (the reply
# names their replica). A head that leaves may let the next ones in: promote again.
CANCEL = _PRELUDE + """
local token = ARGV[6]
local n = maintain()
local code, addr = 0, ''
if redis.call('HGET', W, token) == owner then
  drop_waiter(token)
  code = 1
  promote()
elseif redis.call('HGET', S, token) == owner then
  code = 2
  local _
  _, addr = bound_of(token)
  if ARGV[7] == 'cancel' then
    free(token)
    code, addr = 3, ''
    promote()
  end
end
return reply(code, 0, n, addr)
"""

# ARGV: ..., owner, token, from (the replica the caller's lease names). The one safe
# retry: the held token's k slots move from its replica to the one `pick` chooses among the
# OTHER pickable replicas (eligible, not saturated, k free), in one step: `bound` and both
# `replicas` counts change together, the slots in use never do. Then promote: the room left
# on the old replica may admit the queue head. Reply code 1 (moved; replica = the new one),
# 0 (not moved: no other replica has room, no replicas, or the token is not held: released
# or reclaimed) or -1 (the caller is fenced). Idempotent per (token, from): a retried call
# whose first run moved the token already (the bound replica is no longer `from`) replies 1
# with the replica it is on, and moves nothing.
MOVE = _PRELUDE + """
local token, from = ARGV[6], ARGV[7]
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
"""

# ARGV: ..., owner, token. One wait() round: repair, then where is my token?
POLL = _PRELUDE + """
local token = ARGV[6]
local n = maintain()
if redis.call('HGET', S, token) == owner then
  local _, addr = bound_of(token)
  return reply(1, 0, n, addr)
end
local rank = position(token)
if rank and redis.call('HGET', W, token) == owner then return reply(2, rank, n) end
if not alive() then return reply(-1, 0, n) end
return reply(0, 0, n)
"""

# ARGV: ..., owner (unused). The snapshot refresher's call (and `set_replicas`' wake-up,
# with the new view): repair, promote, count.
MAINTAIN = _PRELUDE + """
local n = maintain()
return reply(0, 0, n)
"""

# ARGV: ..., owner, lease_ms, register. register=1 announces a new owner id;
# otherwise the lease is renewed only if it has not expired: an expired owner may have
# lost its slots to `reclaim` already, so it must learn it is fenced instead.
HEARTBEAT = _PRELUDE + """
local lease_ms = tonumber(ARGV[6])
if ARGV[7] == '1' then
  redis.call('ZADD', O, now + lease_ms, owner)
  return reply(1, 0, 0)
end
if not alive() then return reply(-1, 0, 0) end
redis.call('ZADD', O, 'XX', now + lease_ms, owner)
return reply(1, 0, 0)
"""

# ARGV: ..., owner. Remove an owner and everything it holds (graceful close,
# or the old identity of a fenced process), then hand the freed slots on.
PURGE = _PRELUDE + """
redis.call('ZREM', O, owner)
local n = 0
local held = redis.call('HGETALL', S)
for i = 1, #held, 2 do
  if held[i + 1] == owner then free(held[i]); n = n + 1 end
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
    "maintain": MAINTAIN, "heartbeat": HEARTBEAT, "purge": PURGE, "move": MOVE,
}
