-- release: ARGV: now, token, channel, consumer name. Reply {released 1|0, holders}; a
-- release PUBLISHes the consumer's name so waiters in every process try again at once.

local removed = redis.call('ZREM', key, ARGV[2])
if removed == 1 then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return {removed, redis.call('ZCARD', key)}
