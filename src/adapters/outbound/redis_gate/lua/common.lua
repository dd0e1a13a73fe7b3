-- The part every ledger script starts with (scripts.py prepends this file to each of
-- the others): the key and argument names, the server time, and the helpers.
--
-- Every state change of an upstream's ledger is ONE script, so it is atomic across all
-- gateway processes: no WATCH/MULTI retry loops, no window between "read the count" and
-- "take the slot". Every script but `heartbeat` runs `maintain()`, so whichever process
-- touches the ledger first repairs it:
--
-- 1. `reclaim`: owners whose heartbeat lease has passed (score <= server time in the
--    owners sorted set) lose their slots and queue entries (bounded: 32 owners a call);
-- 2. `expire`: queue entries past their deadline leave the queue (at most 128 a call);
-- 3. `promote`: while the queue head fits, it takes its slots (FIFO by sequence number,
--    or the fair order), and the promoted tokens are PUBLISHed on the upstream's wake
--    channel. Head-of-line: a head that does not fit (a request for k slots, k > the free
--    ones, or no pickable replica with k free) stops the promotion; nobody behind it is
--    admitted first.
--
-- Sequence slots: a request takes k >= 1 slots (`max_choices`). The slots in use are
-- HLEN(slots) plus `extra` (the sum of k - 1 over held tokens with k > 1); a queued token
-- with k > 1 has its k in `want`, a held one in `bound`.
--
-- Replicas: an upstream with `[endpoints]` passes its per-replica cap and the calling
-- process's eligible replicas (its discovery view, less the ones it ejected) in every
-- call; a token is admitted when used + k <= min(cap, eligible x per-replica cap) AND
-- one pickable replica (eligible, not saturated) has k free, and it is bound, in the same
-- script, to the replica `domain.replicas.pick` would choose: the fewest slots in flight,
-- ties rotate after the last one picked (`last`), addresses compared bytewise. `replicas`
-- holds every replica's slots in flight, shared by all processes; `bound` holds a held
-- token's "<k> <replica>", so every release path (release, cancel, reclaim of a dead
-- owner, purge) gives back exactly its k and its replica's k. An ejected replica is thus,
-- inside the scripts, one the caller does not see (the gate still reports it EJECTED).
-- An upstream without replicas and a request for one slot write none of these keys:
-- exactly what the ledger always wrote.
--
-- All times come from the Redis server's `TIME`, so the processes' clocks never have to
-- agree. Redis >= 5 replicates script effects, which makes `TIME` in a writing script safe.
--
-- KEYS: `scripts.KEY_NAMES`, in order. ARGV: the five below, then the script's own.

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
