"""`ports.affinity.AffinityStore` on Redis: every gateway process shares one memory of what
went where per upstream, with the rule of `domain.affinity.AffinityMemory`.

For `key_prefix` P and upstream U (`{U}` is the Redis Cluster hash tag the admission
ledger uses, so an upstream's keys share a slot):

| key | type | content |
|---|---|---|
| `P:{U}:affinity` | hash | chain hash (16 hex digits) -> replica base URL |
| `P:{U}:affinity_lru` | sorted set | chain hash -> when it was last recorded (µs, Redis `TIME`) |

Bounded both ways: at most `capacity` entries (the least recently recorded go first), and
an entry older than `ttl_seconds` is never returned and is removed by the next record;
both keys expire `ttl_seconds` after the last record, so an idle upstream leaves nothing.
One script per call (EVALSHA, reloaded by redis-py after a restart); every time is Redis
`TIME`. A call runs as a task of its own (a hang-up never cancels redis-py mid-command);
Redis unreachable: nothing is found, nothing recorded, one log line per failure streak.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from adapters.outbound.redis_gate.connection import REDIS_DOWN, RedisTarget, connect
from adapters.outbound.redis_usage.tasks import Detached
from domain.affinity import DEFAULT_CAPACITY, DEFAULT_TTL_SECONDS

log = logging.getLogger("gateway.affinity.redis")

_CLOCK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

# KEYS: map, lru. ARGV: ttl (µs), then the chain's hashes. Reply: the replica of each, or nil.
LOOKUP = _CLOCK + """
local oldest = now - tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local replica = redis.call('HGET', KEYS[1], ARGV[i])
  local at = replica and redis.call('ZSCORE', KEYS[2], ARGV[i])
  out[i - 1] = (at and tonumber(at) > oldest) and replica or false
end
return out
"""

# KEYS: map, lru. ARGV: ttl (µs), capacity, replica, then the chain's hashes.
RECORD = _CLOCK + """
local ttl, cap, replica = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local pairs_, scores = {}, {}
for i = 4, #ARGV do
  pairs_[#pairs_ + 1] = ARGV[i]; pairs_[#pairs_ + 1] = replica
  scores[#scores + 1] = now; scores[#scores + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(pairs_))
redis.call('ZADD', KEYS[2], unpack(scores))
local function drop(members)
  for i = 1, #members, 500 do
    local part = {unpack(members, i, math.min(i + 499, #members))}
    redis.call('HDEL', KEYS[1], unpack(part))
    redis.call('ZREM', KEYS[2], unpack(part))
  end
end
drop(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl, 'LIMIT', 0, 1000))
local over = redis.call('ZCARD', KEYS[2]) - cap
if over > 0 then drop(redis.call('ZRANGE', KEYS[2], 0, over - 1)) end
local ms = math.ceil(ttl / 1000)
redis.call('PEXPIRE', KEYS[1], ms)
redis.call('PEXPIRE', KEYS[2], ms)
return 1
"""


def affinity_keys(prefix: str, upstream: str) -> list[str]:
    base = f"{prefix}:{{{upstream}}}"
    return [f"{base}:affinity", f"{base}:affinity_lru"]


class RedisAffinityStore:
    # A chain has at most domain.affinity.CHECKPOINTS + TAIL_MESSAGES (79) hashes: one script call stays small.

    def __init__(self, redis_url: str | RedisTarget, key_prefix: str = "gateway", *, capacity: int = DEFAULT_CAPACITY,
                 ttl_seconds: float = DEFAULT_TTL_SECONDS, socket_timeout: float = 1.0) -> None:  # fmt: skip
        if capacity < 1 or not ttl_seconds > 0:
            raise ValueError("capacity must be >= 1 and ttl_seconds > 0")
        self._redis = connect(redis_url, socket_timeout)
        self._lookup = self._redis.register_script(LOOKUP)
        self._record = self._redis.register_script(RECORD)
        self._prefix = key_prefix
        self._capacity = capacity
        self._ttl_us = int(ttl_seconds * 1_000_000)
        self._keys: dict[str, list[str]] = {}
        self._tasks = Detached()
        self._failing = False

    async def lookup(self, upstream: str, chain: Sequence[int]) -> list[str]:
        if not chain:
            return []
        reply = await self._call(self._lookup(keys=self._keys_of(upstream), args=[self._ttl_us, *map(_hex, chain)]))
        out: list[str] = []
        for replica in reply or ():
            if replica and replica not in out:
                out.append(replica)
        return out

    async def record(self, upstream: str, chain: Sequence[int], replica: str) -> None:
        if chain:
            args: list[str | int] = [self._ttl_us, self._capacity, replica, *map(_hex, chain)]
            await self._call(self._record(keys=self._keys_of(upstream), args=args))

    async def close(self) -> None:
        await self._tasks.wait(2.0)
        await self._redis.aclose()

    def _keys_of(self, upstream: str) -> list[str]:
        keys = self._keys.get(upstream)
        if keys is None:
            keys = self._keys[upstream] = affinity_keys(self._prefix, upstream)
        return keys

    async def _call(self, call: Any) -> Any:
        task = self._tasks.spawn(call)
        try:
            reply = await asyncio.shield(task)
        except REDIS_DOWN as error:
            if not self._failing:
                log.warning("redis affinity: unavailable, requests go to the least loaded replica: %s", error)
                self._failing = True
            return None
        if self._failing:
            log.warning("redis affinity: available again")
            self._failing = False
        return reply


def _hex(digest: int) -> str:
    return f"{digest:016x}"
