-- The token order (`fairness = "tokens"`, `domain.admission.token_order`: the Virtual
-- Token Counter), shared by every process. Its keys:
--
--   SV (`service`)  HASH consumer -> its service: weighted tokens served / its weight.
--                   Never expires: one field per consumer of the keys file ever charged.
--   TL (`tlast`)    HASH band -> the consumer last admitted in the band (from the queue
--                   or at once): the lift's level when nobody waits in the band.
--   TW (`twait`)    ZSET, score 0: "<band>:<hex consumer>" for each consumer with tickets
--                   queued in the band; lexical order, so a band's waiting consumers are
--                   one range and the highest band with waiters is the first member.
--   TQ (`tqueue`)   ZSET, score 0: "<band>:<hex consumer>:<seq>:<token>", the queued
--                   tickets; one consumer's in a band are one range, oldest first.
--   TH (`theld`)    HASH consumer -> its admitted requests not yet released (only > 0).
--   TO (`tholder`)  HASH held token -> its consumer: `free` (common.lua), the one place
--                   every release path goes through, counts it down in TH.
--
-- The lift is for a consumer that was IDLE: nothing queued in the band (TW) AND nothing
-- holding slots (TH). One that keeps about twice the cap in flight often has nothing
-- queued for an instant while its requests run; lifting it then would throw away the
-- deficit it is catching up on.
--
-- A consumer's name is written in hex in the members: names may hold any character, and
-- ':' then ends it unambiguously. `entries` maps a token to its TQ member, so every path
-- that takes a token out of the queue (`forget_entry`) takes it out of TQ and TW too.
-- Service values are floats (HINCRBYFLOAT; corrections may be negative).

local function hex(s)
  return (string.gsub(s, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

local function unhex(h)
  return (string.gsub(h, '%x%x', function(c) return string.char(tonumber(c, 16)) end))
end

local function service_of(name)
  return tonumber(redis.call('HGET', SV, name)) or 0
end

-- ARGV[5]: "<hex consumer> <tokens> ..." charged since the caller's last call, already
-- weighted and divided by the consumer's weight; applied before anything else.
do
  local who
  for w in string.gmatch(ARGV[5], '%S+') do
    if who == nil then who = w
    else
      redis.call('HINCRBYFLOAT', SV, unhex(who), w)
      who = nil
    end
  end
end

-- the waiting consumers ("<band>:<hex>") of a band
local function waiting_in(b)
  return redis.call('ZRANGEBYLEX', TW, '[' .. b .. ':', '(' .. b .. ';')
end

-- a waiting consumer's dispatch key (its service, its oldest ticket's sequence number) and
-- that ticket's member
local function token_key(wm)
  local first = redis.call('ZRANGEBYLEX', TQ, '[' .. wm .. ':', '(' .. wm .. ';', 'LIMIT', 0, 1)[1]
  local s = service_of(unhex(string.match(wm, ':(%x*)$')))
  return s, tonumber(string.match(first, ':(%d+):[^:]*$')), first
end

local function lower(s, q, bs, bq)
  return s < bs or (s == bs and q < bq)
end

-- the TQ member dispatched next: the least-served waiting consumer's oldest ticket in the
-- highest band with waiters (ties: the older oldest ticket); nil when none waits
local function token_head()
  local top = redis.call('ZRANGE', TW, 0, 0)[1]
  if not top then return nil end
  local best, bs, bq
  for _, wm in ipairs(waiting_in(string.match(top, '^([^:]*):'))) do
    local s, q, m = token_key(wm)
    if best == nil or lower(s, q, bs, bq) then best, bs, bq = m, s, q end
  end
  return best
end

-- a ticket of `consumer` is queued in band `b` as TQ member `member`: lift the consumer
-- first if it was idle (nothing queued in the band, nothing holding slots) to the least
-- service among the band's waiting consumers (nobody waiting: to the service of the one
-- last admitted in it); never lowered
local function token_push(b, consumer, member)
  local wm = b .. ':' .. hex(consumer)
  if not redis.call('ZSCORE', TW, wm) and redis.call('HEXISTS', TH, consumer) == 0 then
    local floor, raw
    for _, other in ipairs(waiting_in(b)) do
      local r = redis.call('HGET', SV, unhex(string.match(other, ':(%x*)$'))) or '0'
      local s = tonumber(r)
      if floor == nil or s < floor then floor, raw = s, r end
    end
    if floor == nil then
      local last = redis.call('HGET', TL, b)
      raw = last and redis.call('HGET', SV, last) or '0'
      floor = tonumber(raw)
    end
    if service_of(consumer) < floor then redis.call('HSET', SV, consumer, raw) end
  end
  redis.call('ZADD', TW, 0, wm)
  redis.call('ZADD', TQ, 0, member)
end

-- the member left TQ (dispatched or gone): its consumer stops waiting in the band when it
-- was its last ticket there
local function token_drop(member)
  if redis.call('ZREM', TQ, member) == 0 then return end
  local wm = string.match(member, '^([^:]*:%x*):')
  if #redis.call('ZRANGEBYLEX', TQ, '[' .. wm .. ':', '(' .. wm .. ';', 'LIMIT', 0, 1) == 0 then
    redis.call('ZREM', TW, wm)
  end
end

-- `token` of `consumer` was admitted in band `b` (at once or from the queue): the lift's
-- level later, and it holds slots until `free`
local function token_admitted(b, consumer, token)
  redis.call('HSET', TL, b, consumer)
  redis.call('HSET', TO, token, consumer)
  redis.call('HINCRBY', TH, consumer, 1)
end

-- `TokenOrder.rank`: 1 + the higher bands' tickets + a round robin within the band (up to
-- place + 1 of each consumer served first, place of each other), place = the tickets of
-- the same consumer ahead of this one
local function token_rank(member)
  local b, h = string.match(member, '^([^:]*):(%x*):')
  local wm = b .. ':' .. h
  local ahead = redis.call('ZLEXCOUNT', TQ, '-', '(' .. b .. ':')
  local place = redis.call('ZLEXCOUNT', TQ, '[' .. wm .. ':', '(' .. member)
  local s, q = token_key(wm)
  for _, other in ipairs(waiting_in(b)) do
    if other ~= wm then
      local os, oq = token_key(other)
      local theirs = redis.call('ZLEXCOUNT', TQ, '[' .. other .. ':', '(' .. other .. ';')
      ahead = ahead + math.min(theirs, lower(os, oq, s, q) and place + 1 or place)
    end
  end
  return ahead + place + 1
end
