-- The queue's part of every ledger script (scripts.py sends common.lua, tokens.lua, then
-- this file, then the script's own): queue entries, positions, the fair order's
-- normalization, and `reclaim`, `expire`, `promote`, `maintain` and `reply` (common.lua
-- tells what they do and why).

-- E: token -> "<member> <consumer>": its fair member (`fair`), its token order member
-- (`tqueue`), or '' (fifo with a per-consumer limit)
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
  if member ~= '' then
    redis.call('ZREM', F, member)
    token_drop(member)
  end
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

-- 1-based place in dispatch order: in the fair order if the token has a fair member, the
-- token order's estimate if it has a token member, else in arrival order
local function position(token)
  local rank = redis.call('ZRANK', Q, token)
  if not rank then return nil end
  local member = entry_of(token)
  if member and member ~= '' then
    local r = redis.call('ZRANK', F, member)
    if r then return r + 1 end
    if redis.call('ZSCORE', TQ, member) then return token_rank(member) end
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

-- Free slots go to the smallest keys: the fair order F first (fair mode), then the token
-- order (tokens mode), then the arrival order Q (fifo mode: F and the token order are
-- empty, so this is exactly the fifo head). Head-of-line: the first head that does not
-- fit ends the round. A grant is published as the token, or "<token>|<replica>" when it
-- is bound to a replica.
local function promote(newcomer, prefer, max_extra)
  if used() >= live_cap() then return end
  local granted = {}
  while true do
    local token, member, tm
    local head = redis.call('ZRANGE', F, 0, 0)
    if #head > 0 then
      member = head[1]
      token = string.match(member, '^[^:]*:%d+:%d+:(.+)$')
    else
      tm = token_head()
      if tm then
        token = string.match(tm, ':([^:]*)$')
      else
        local rest = redis.call('ZRANGE', Q, 0, 0)
        if #rest == 0 then break end
        token = rest[1]
      end
    end
    local who = redis.call('HGET', W, token)
    if who then
      local wish = token == newcomer and prefer or nil  -- affinity only for the arriving request
      local addr = take(token, who, tonumber(redis.call('HGET', WANT, token)) or 1, wish, max_extra)
      if not addr then break end
      granted[#granted + 1] = addr == '' and token or (token .. '|' .. addr)
      if tm then
        local b, h = string.match(tm, '^([^:]*):(%x*):')
        token_admitted(b, unhex(h), token)
      end
    end
    if member then
      local b, tag = string.match(member, '^([^:]*):(%d+):')
      redis.call('ZREM', F, member)
      redis.call('HSET', VT, b, tonumber(tag))  -- V[band] = the dispatched finish tag
    end
    if tm then token_drop(tm) end  -- (a token no longer waiting has no entry to forget it by)
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
