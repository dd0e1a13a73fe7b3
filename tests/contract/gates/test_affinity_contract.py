"""One contract for the affinity memory on both backends (`ports.affinity.AffinityStore`): what
went where, longest prefix first, bounded in entries and in time, one memory per upstream; on
Redis shared by every store (process) and gone once idle.

The Redis variant uses the Redis at GATEWAY_TEST_REDIS_URL (default redis://127.0.0.1:6379/0)
with a random key prefix, and FAILS when it is unreachable. Real time."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, require_redis

from adapters.outbound.memory_affinity import MemoryAffinityStore
from adapters.outbound.redis_affinity import RedisAffinityStore, affinity_keys
from domain.affinity import affinity_chain
from domain.canonical import ChatRequest, Message, TextPart

A, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"


class Backend:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
        self.made: list[Any] = []

    def store(self, capacity: int = 1000, ttl: float = 60.0) -> Any:
        made: Any = (MemoryAffinityStore(capacity, ttl) if self.kind == "memory"
                     else RedisAffinityStore(REDIS_URL, self.prefix, capacity=capacity, ttl_seconds=ttl))  # fmt: skip
        self.made.append(made)
        return made


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "redis":
        await require_redis()
    made = Backend(request.param)
    yield made
    for store in made.made:
        await store.close()
    if made.kind == "redis":
        await delete_prefix(made.prefix)


def turns(tag: str, n: int) -> list[list[int]]:
    history = [Message(role="system", content=[TextPart(text="You are an agent. " * 40)]),
               Message(role="user", content=[TextPart(text=f"{tag} go")])]  # fmt: skip
    chains = [affinity_chain(ChatRequest(model="m", messages=list(history)))]
    for k in range(n - 1):
        history += [Message(role="assistant", content=[TextPart(text=f"answer {k} " * 40)]),
                    Message(role="user", content=[TextPart(text=f"next {k}")])]  # fmt: skip
        chains.append(affinity_chain(ChatRequest(model="m", messages=list(history))))
    return chains


async def test_the_next_turn_finds_the_replica_of_the_last(backend: Backend) -> None:
    store = backend.store()
    first, second, third = turns("conv-1", 3)
    assert await store.lookup("up", first) == []
    await store.record("up", first, A)
    assert await store.lookup("up", second) == [A]
    await store.record("up", second, B)  # it went elsewhere: the shared prefix moves with it
    assert await store.lookup("up", third) == [B]
    await store.record("up", third[-1:], C)  # a shorter prefix (say, the system prompt) went to C
    assert await store.lookup("up", third) == [B, C]  # longest match first, each replica once
    assert await store.lookup("other", third) == []  # one memory per upstream
    assert await store.lookup("up", []) == [] and await store.record("up", [], A) is None


async def test_bounded_in_entries_least_recently_recorded_first(backend: Backend) -> None:
    store = backend.store(capacity=5)
    await store.record("up", [1, 2, 3], A)
    await asyncio.sleep(0.002)
    await store.record("up", [4, 5], B)
    await asyncio.sleep(0.002)
    await store.record("up", [1], A)  # recorded again: now the most recent
    await asyncio.sleep(0.002)
    await store.record("up", [6, 7], C)  # two over: the oldest two (2, 3) go
    assert await store.lookup("up", [2]) == [] and await store.lookup("up", [3]) == []
    assert await store.lookup("up", [1, 4, 5, 6, 7]) == [A, B, C]
    if backend.kind == "redis":
        client = Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            mapping, lru = affinity_keys(backend.prefix, "up")
            assert await client.hlen(mapping) == await client.zcard(lru) == 5
        finally:
            await client.aclose()


async def test_entries_expire_after_the_ttl_and_an_idle_upstream_leaves_nothing(backend: Backend) -> None:
    store = backend.store(ttl=0.3)
    await store.record("up", [10, 11], A)
    assert await store.lookup("up", [10]) == [A]
    await asyncio.sleep(0.45)
    assert await store.lookup("up", [11, 10]) == []
    await store.record("up", [12], B)
    assert await store.lookup("up", [10, 12]) == [B]
    if backend.kind == "redis":
        client = Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            mapping, lru = affinity_keys(backend.prefix, "up")
            assert await client.hkeys(mapping) == [f"{12:016x}"]  # the record swept the expired
            await asyncio.sleep(0.45)
            assert await client.exists(mapping, lru) == 0  # both keys expire with their last entry
        finally:
            await client.aclose()


async def test_every_store_on_one_redis_shares_one_memory() -> None:
    await require_redis()
    backend = Backend("redis")
    stores = [backend.store() for _ in range(3)]
    try:
        chains = turns("conv-9", 3)
        await stores[0].record("up", chains[0], B)
        assert [await s.lookup("up", chains[1]) for s in stores] == [[B], [B], [B]]
        await stores[2].record("up", chains[1], C)
        assert await stores[1].lookup("up", chains[2]) == [C]
    finally:
        for store in stores:
            await store.close()
        await delete_prefix(backend.prefix)


async def test_a_redis_that_is_down_finds_nothing_and_never_raises() -> None:
    store = RedisAffinityStore("redis://127.0.0.1:9/0", "gwtest-down", socket_timeout=0.3)
    try:
        await store.record("up", [1], A)
        assert await store.lookup("up", [1]) == []
    finally:
        await store.close()
