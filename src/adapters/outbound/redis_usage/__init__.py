"""Consumer counters on Redis: request/token limits and `max_in_flight` for ALL processes.

Keys, for `[admission] key_prefix` P and consumer name C (`{consumer:C}` is a Redis
Cluster hash tag, so one consumer's keys share a slot):

    P:{consumer:C}:rate   HASH  r, t: request / token bucket levels (1/60000 token units),
                                s: their stamp (ms), d: UTC day, u: tokens used that day;
                                TTL = until it would equal a fresh state
    P:{consumer:C}:held   ZSET  slot token -> lease expiry (ms); TTL = the longest lease
    P:consumers:free      pub/sub channel: the name of a consumer whose slot was released

Every operation is one Lua script (`lua/`, loaded by `scripts.py`); see docs/redis-ledger.md
("Consumer counters") for the failure model.
"""

from adapters.outbound.redis_usage.concurrency import RedisConsumerConcurrency, RedisSlot
from adapters.outbound.redis_usage.ledger import RedisReservation, RedisUsageLedger

__all__ = ["RedisConsumerConcurrency", "RedisReservation", "RedisSlot", "RedisUsageLedger"]
