"""The factories bootstrap calls: the backend of `[admission]` picks the counters."""

from __future__ import annotations

import pytest

from adapters.outbound.consumer_counters import consumer_concurrency, usage_ledger
from adapters.outbound.memory_usage import InMemoryConsumerConcurrency, InMemoryUsageLedger
from adapters.outbound.redis_usage import RedisConsumerConcurrency, RedisUsageLedger


async def test_the_memory_backend_counts_in_this_process() -> None:
    assert isinstance(usage_ledger("memory"), InMemoryUsageLedger)
    assert isinstance(consumer_concurrency("memory"), InMemoryConsumerConcurrency)


async def test_the_redis_backend_shares_the_counters() -> None:
    ledger = usage_ledger("redis", "redis://127.0.0.1:1/0", "pfx")
    slots = consumer_concurrency("redis", "redis://127.0.0.1:1/0", "pfx", lease_seconds=3.0)
    assert isinstance(ledger, RedisUsageLedger) and isinstance(slots, RedisConsumerConcurrency)
    await ledger.close()  # never started, never connected
    await slots.close()
    with pytest.raises(ValueError, match="redis_url"):
        usage_ledger("redis")
    with pytest.raises(ValueError, match="redis_url"):
        consumer_concurrency("redis", None)
