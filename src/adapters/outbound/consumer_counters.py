"""Factories for the consumer counters, on the same backend as the admission gate.

bootstrap calls these with the `[admission]` table's values: `backend = "memory"` keeps
the counters in this process, `"redis"` shares them between every process at `redis_url`
(a URL, or a `RedisTarget`: Sentinel or cluster, like the gate's) under `key_prefix`, with
the slot leases of `lease_seconds`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from adapters.outbound.memory_usage import InMemoryConsumerConcurrency, InMemoryUsageLedger
from ports.consumers import ConsumerConcurrency, UsageLedger

if TYPE_CHECKING:
    from adapters.outbound.redis_gate.connection import RedisTarget


def usage_ledger(backend: Literal["memory", "redis"], redis_url: str | RedisTarget | None = None,
                 key_prefix: str = "gateway") -> UsageLedger:
    if backend == "memory":
        return InMemoryUsageLedger()
    if not redis_url:
        raise ValueError("the redis backend needs a redis_url")
    from adapters.outbound.redis_usage import RedisUsageLedger  # a memory-only process never loads redis

    return RedisUsageLedger(redis_url, key_prefix)


def consumer_concurrency(backend: Literal["memory", "redis"], redis_url: str | RedisTarget | None = None,
                         key_prefix: str = "gateway", lease_seconds: float = 10.0) -> ConsumerConcurrency:
    if backend == "memory":
        return InMemoryConsumerConcurrency()
    if not redis_url:
        raise ValueError("the redis backend needs a redis_url")
    from adapters.outbound.redis_usage import RedisConsumerConcurrency

    return RedisConsumerConcurrency(redis_url, key_prefix, lease_seconds)
