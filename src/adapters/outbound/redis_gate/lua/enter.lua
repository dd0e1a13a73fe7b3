-- enter: a request arrives. ARGV after the owner: token, depth, timeout_ms, order ('1'
-- fair, '2' tokens, '0' fifo), consumer, band (fair and tokens), step, limit
-- (max_queued_per_consumer, 0 = none), tags_grace_ms, slots (k), the consumer's priority
-- (counted per priority while queued; 0 is the rest of the queue), prefer (affinity:
-- replicas best first, space-separated; '' for none) and
-- max_extra: they weigh only in the pick of THIS request admitted at once (nobody waits,
-- or a fair or tokens newcomer placed first); one promoted later goes to the least loaded.
-- Idempotent per token, so a retried call (lost reply) reports the token's state instead
-- of queueing it twice. With order '0', limit 0, k 1 and no replicas (fifo, no
-- per-consumer limit) it writes exactly what it always did.

local token, depth, timeout_ms = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local fair, tokens, consumer = ARGV[10] == '1', ARGV[10] == '2', ARGV[11]
local b, step = ARGV[12], tonumber(ARGV[13])
local limit, k, priority = tonumber(ARGV[14]), tonumber(ARGV[16]), ARGV[17]
local prefer, max_extra = {}, tonumber(ARGV[19]) or 0
for a in string.gmatch(ARGV[18] or '', '%S+') do prefer[#prefer + 1] = a end
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
  if addr then
    if tokens then token_admitted(b, consumer, token) end
    return reply(1, 0, n, addr)
  end
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
if not fair and not tokens and limit == 0 then return reply(2, waiting + 1, n) end
local member, place = '', waiting + 1
if fair then  -- start = max(V[band], last[band][consumer]); finish = start + step
  local field = b .. ':' .. consumer
  local start = math.max(tonumber(redis.call('HGET', VT, b)) or 0,
                         tonumber(redis.call('HGET', TG, field)) or 0)
  local finish = start + step
  redis.call('HSET', TG, field, finish)
  redis.call('PEXPIRE', TG, timeout_ms + tonumber(ARGV[15]))
  member = string.format('%s:%016d:%016d:%s', b, finish, seq, token)
  redis.call('ZADD', F, 0, member)
  place = redis.call('ZRANK', F, member) + 1
elseif tokens then
  member = string.format('%s:%s:%016d:%s', b, hex(consumer), seq, token)
  token_push(b, consumer, member)
  place = token_rank(member)
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
