-- The part every ledger script starts with (scripts.py prepends this file, then
-- `tokens.lua` and `queue.lua`, to each of the others): the key and argument names, the
-- server time and the slot and replica helpers; `tokens.lua` holds the token order's,
-- `queue.lua` the queue's (entries, positions, reclaim, expire, promote, reply).
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
--    the fair order or the token order), and the promoted tokens are PUBLISHed on the
--    upstream's wake channel. Head-of-line: a head that does not fit (a request for k
--    slots, k > the free ones, or no pickable replica with k free) stops the promotion;
--    nobody behind it is admitted first.
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
-- KEYS: `scripts.KEY_NAMES`, in order. ARGV: the six below, then the script's own.

local Q, D, W, S, O, SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local F, E, N, VT, TG = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local WANT, BOUND, EXTRA, R, LAST = KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local PRI, BYP = KEYS[17], KEYS[18]
local SV, TL, TW, TQ = KEYS[19], KEYS[20], KEYS[21], KEYS[22]
local TH, TO = KEYS[23], KEYS[24]
local cap, channel, rlimit, owner = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[6]
-- ARGV[5]: the token service charged in the caller since its last call (`tokens.lua`),
-- applied before anything else the script does
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

-- give back every slot a held token holds, and its replica's; under `fairness = "tokens"`
-- its consumer holds one request fewer (`tokens.lua`: TH and TO). Every release path
-- (release, cancel, reclaim of a dead owner, purge) goes through here.
local function free(token)
  redis.call('HDEL', S, token)
  local holder = redis.call('HGET', TO, token)
  if holder then
    redis.call('HDEL', TO, token)
    if redis.call('HINCRBY', TH, holder, -1) <= 0 then redis.call('HDEL', TH, holder) end
  end
  local k, addr = bound_of(token)
  if k == 1 and addr == '' then return end
  redis.call('HDEL', BOUND, token)
  if k > 1 and redis.call('DECRBY', EXTRA, k - 1) <= 0 then redis.call('DEL', EXTRA) end
  if addr ~= '' and redis.call('HINCRBY', R, addr, -k) <= 0 then redis.call('HDEL', R, addr) end
end

