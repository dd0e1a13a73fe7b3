"""One contract for the consumer counters on both backends: the usage ledger (request and
token limits) and `max_in_flight` per consumer.

The Redis variant uses the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0, `scripts/ensure-redis` starts one) with a random key prefix, and
FAILS when it is unreachable; the `cluster` variant runs the same tests on a 3-master Redis
Cluster of its own (`redis_cluster = true`). Real time, except where a test passes its own
wall clock to reach a UTC midnight.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, redis_target, require_redis

from adapters.outbound.memory_usage import InMemoryConsumerConcurrency, InMemoryUsageLedger
from adapters.outbound.redis_gate.connection import RedisTarget
from adapters.outbound.redis_usage import RedisConsumerConcurrency, RedisUsageLedger
from domain.consumers import EMPTY_SNAPSHOT, Consumer, ConsumerLimits, LimitKind
from domain.errors import QueueTimeout, RateLimited

DAY = 86_400
MIDNIGHT = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def consumer(name: str = "frontend", **limits: int) -> Consumer:
    return Consumer(name=name, limits=ConsumerLimits(**limits))


class WallClock:
    """A settable wall clock (seconds since the epoch)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Backend:
    def __init__(self, kind: str, prefix: str, target: str | RedisTarget = REDIS_URL, url: str = REDIS_URL) -> None:
        self.kind, self.prefix, self.target, self.url = kind, prefix, target, url
        self.made: list[Any] = []

    async def ledger(self, wall_time: Callable[[], float] | None = None) -> Any:
        if self.kind == "memory":
            made: Any = InMemoryUsageLedger(wall_time) if wall_time else InMemoryUsageLedger()
        else:
            made = RedisUsageLedger(self.target, self.prefix, wall_time=wall_time)
        await made.start()
        self.made.append(made)
        return made

    async def concurrency(self) -> Any:
        if self.kind == "memory":
            made: Any = InMemoryConsumerConcurrency()
        else:
            made = RedisConsumerConcurrency(self.target, self.prefix, lease_seconds=5.0)
        await made.start()
        self.made.append(made)
        return made

    async def leftovers(self) -> list[str]:
        """Keys of this test still in Redis (none for memory)."""
        if self.kind == "memory":
            return []
        client: Any = (ClusterClient if self.kind == "cluster" else Redis).from_url(self.url, decode_responses=True)
        try:
            return [key async for key in client.scan_iter(match=f"{self.prefix}:*", count=500)]
        finally:
            await client.aclose()


@pytest.fixture(params=["memory", "redis", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    kind: str = request.param
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    if kind == "memory":
        made = Backend(kind, prefix)
    else:
        target, url = redis_target(kind, request)
        await require_redis(url)
        made = Backend(kind, prefix, target, url)
    yield made
    for thing in made.made:
        await thing.close()
    if kind != "memory":
        await delete_prefix(made.prefix, made.url, cluster=kind == "cluster")


async def test_requests_per_minute_admits_exactly_the_limit(backend: Backend) -> None:
    ledger = await backend.ledger()
    frontend = consumer(requests_per_minute=10)
    snapshots = [await ledger.take_request(frontend) for _ in range(10)]
    assert [s.requests.remaining for s in snapshots] == list(range(9, -1, -1))
    with pytest.raises(RateLimited) as caught:
        await ledger.take_request(frontend)
    refused = caught.value
    assert refused.limit is LimitKind.REQUESTS_PER_MINUTE and refused.status == 429
    assert 5 <= (refused.retry_after or 0) <= 6  # one request refills every 6 s
    assert refused.snapshot.requests is not None and refused.snapshot.requests.remaining == 0
    other = await ledger.take_request(consumer("batch", requests_per_minute=10))  # its own limit
    assert other.requests.remaining == 9


async def test_an_unlimited_consumer_passes_and_reports_nothing(backend: Backend) -> None:
    ledger = await backend.ledger()
    for _ in range(50):
        assert await ledger.take_request(consumer("free", max_in_flight=3)) == EMPTY_SNAPSHOT
        reservation = await ledger.reserve_tokens(consumer("free", max_in_flight=3), 10_000)
        assert reservation.snapshot == EMPTY_SNAPSHOT
        await reservation.settle(12_345)
    assert await backend.leftovers() == []


async def test_concurrent_token_reservations_overshoot_by_at_most_one(backend: Backend) -> None:
    ledger = await backend.ledger()
    frontend = consumer(tokens_per_minute=1000)
    sizes = [random.randint(100, 400) for _ in range(20)]

    async def one(tokens: int) -> int:
        try:
            await ledger.reserve_tokens(frontend, tokens)
        except RateLimited as refused:
            assert refused.limit is LimitKind.TOKENS_PER_MINUTE and (refused.retry_after or 0) >= 1
            return 0
        return tokens

    taken = [t for t in await asyncio.gather(*(one(s) for s in sizes)) if t]
    assert taken, "nothing was admitted"
    assert sum(taken) <= 1000 + max(taken)
    assert sum(taken) - max(taken) < 1000 + 1  # each admission found the bucket not yet empty


async def test_settle_refunds_and_charges_extra(backend: Backend) -> None:
    clock = WallClock(MIDNIGHT + 3600)
    ledger = await backend.ledger(clock)
    frontend = consumer(tokens_per_minute=1000, requests_per_minute=100)
    await ledger.take_request(frontend)
    first = await ledger.reserve_tokens(frontend, 800)
    assert first.snapshot.tokens.remaining == 200
    with pytest.raises(RateLimited):
        await ledger.reserve_tokens(frontend, 500)
    await first.settle(100)  # used far less than estimated
    await first.settle(900)  # idempotent: the first settle counts
    second = await ledger.reserve_tokens(frontend, 500)
    assert second.snapshot.tokens.remaining == 400
    await second.settle(1400)  # used more: charged the difference, the bucket goes below zero
    with pytest.raises(RateLimited) as caught:
        await ledger.reserve_tokens(frontend, 1)
    assert caught.value.retry_after == 31  # 501 tokens to refill at 1000 a minute: 30.06 s
    assert caught.value.snapshot.requests.remaining == 99  # the one request taken, nothing else
    clock.now += 36  # 600 tokens back: the bucket holds 100
    third = await ledger.reserve_tokens(frontend, 0)
    assert third.snapshot.tokens.remaining == 100 and third.snapshot.requests.remaining == 100  # refilled
    await third.settle(0)


async def test_refunds_bring_the_counters_back_to_full(backend: Backend) -> None:
    clock = WallClock(MIDNIGHT + 7200)
    ledger = await backend.ledger(clock)
    frontend = consumer(tokens_per_minute=5000)
    held = [await ledger.reserve_tokens(frontend, 1000) for _ in range(5)]
    with pytest.raises(RateLimited):
        await ledger.reserve_tokens(frontend, 1000)
    await asyncio.gather(*(r.settle(0) for r in held))
    assert await backend.leftovers() == []  # fresh again: the key is gone (Redis)
    probe = await ledger.reserve_tokens(frontend, 0)
    assert probe.snapshot.tokens.remaining == 5000 and probe.snapshot.tokens.reset_seconds == 0


async def test_the_day_window_restarts_at_utc_midnight(backend: Backend) -> None:
    clock = WallClock(MIDNIGHT + DAY - 10)  # 23:59:50
    ledger = await backend.ledger(clock)
    frontend = consumer(tokens_per_day=1000)
    yesterday = await ledger.reserve_tokens(frontend, 900)
    state = yesterday.snapshot.tokens
    assert (state.kind, state.remaining, state.reset_seconds) == (LimitKind.TOKENS_PER_DAY, 100, 10.0)
    with pytest.raises(RateLimited) as caught:
        await ledger.reserve_tokens(frontend, 200)
    assert caught.value.limit is LimitKind.TOKENS_PER_DAY and caught.value.retry_after == 10
    clock.now = MIDNIGHT + DAY  # midnight UTC
    today = await ledger.reserve_tokens(frontend, 700)
    assert today.snapshot.tokens.remaining == 300 and today.snapshot.tokens.reset_seconds == DAY
    await yesterday.settle(0)  # yesterday's refund does not touch today's window
    after = await ledger.reserve_tokens(frontend, 0)
    assert after.snapshot.tokens.remaining == 300
    big = await ledger.reserve_tokens(consumer("big", tokens_per_day=1000), 5000)  # larger than the day: once
    assert big.snapshot.tokens.remaining == 0
    with pytest.raises(RateLimited):
        await ledger.reserve_tokens(consumer("big", tokens_per_day=1000), 1)


async def test_requests_are_counted_at_the_door_and_tokens_apart(backend: Backend) -> None:
    """Two steps: a request refused for its tokens stays counted; a token refusal takes no
    tokens; taking a request never looks at the token limits."""
    clock = WallClock(MIDNIGHT + 600)
    ledger = await backend.ledger(clock)
    frontend = consumer(requests_per_minute=3, tokens_per_minute=100)
    assert (await ledger.take_request(frontend)).requests.remaining == 2
    await ledger.reserve_tokens(frontend, 150)  # larger than the limit: from a full bucket, once
    assert (await ledger.take_request(frontend)).requests.remaining == 1  # tokens below zero: no matter
    with pytest.raises(RateLimited) as caught:
        await ledger.reserve_tokens(frontend, 10)
    refused = caught.value
    assert refused.limit is LimitKind.TOKENS_PER_MINUTE and refused.snapshot.requests.remaining == 1
    assert refused.snapshot.tokens.remaining == 0
    await ledger.take_request(frontend)
    with pytest.raises(RateLimited) as caught:
        await ledger.take_request(frontend)
    assert caught.value.limit is LimitKind.REQUESTS_PER_MINUTE
    assert caught.value.retry_after == 20  # 3 a minute: one every 20 s


async def test_max_waiting_bounds_a_consumers_waiters(backend: Backend) -> None:
    slots = await backend.concurrency()
    frontend = consumer(max_in_flight=1)
    holder = await slots.acquire(frontend, 1.0, 2)
    waiters = [asyncio.create_task(slots.acquire(frontend, 5.0, 2)) for _ in range(2)]
    await asyncio.sleep(0.05)
    with pytest.raises(RateLimited) as caught:  # a third would wait: refused at once
        await asyncio.wait_for(slots.acquire(frontend, 5.0, 2), 1.0)
    assert caught.value.limit is LimitKind.MAX_IN_FLIGHT and caught.value.status == 429
    with pytest.raises(RateLimited):  # max_waiting 0: nobody waits
        await asyncio.wait_for(slots.acquire(frontend, 5.0, 0), 1.0)
    other = await slots.acquire(consumer("other", max_in_flight=1), 1.0, 0)  # its own slots
    await other.release()
    waiters[0].cancel()  # a waiter that leaves frees its place
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    third = asyncio.create_task(slots.acquire(frontend, 5.0, 2))
    await holder.release()
    first = await asyncio.wait_for(waiters[1], 5)
    await first.release()
    await (await asyncio.wait_for(third, 5)).release()
    assert await backend.leftovers() == []


async def test_max_in_flight_is_never_exceeded_under_load(backend: Backend) -> None:
    slots = await backend.concurrency()
    frontend = consumer(max_in_flight=2)
    current = peak = 0

    async def one() -> None:
        nonlocal current, peak
        slot = await slots.acquire(frontend, 10.0, 64)
        try:
            current += 1
            peak = max(peak, current)
            await asyncio.sleep(0.02)
            current -= 1
        finally:
            await slot.release()

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(10))), 20)
    assert peak == 2
    assert await backend.leftovers() == []


async def test_waiters_are_served_in_arrival_order(backend: Backend) -> None:
    slots = await backend.concurrency()
    frontend = consumer(max_in_flight=1)
    holder = await slots.acquire(frontend, 1.0, 64)
    order: list[int] = []

    async def wait(i: int) -> None:
        slot = await slots.acquire(frontend, 5.0, 64)
        order.append(i)
        await slot.release()

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(wait(i)))
        await asyncio.sleep(0.02)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == [0, 1, 2, 3]


async def test_a_wait_times_out_and_a_cancelled_wait_leaves_no_trace(backend: Backend) -> None:
    slots = await backend.concurrency()
    frontend = consumer(max_in_flight=2)
    held = [await slots.acquire(frontend, 1.0, 64) for _ in range(2)]
    with pytest.raises(QueueTimeout) as caught:
        await slots.acquire(frontend, 0.2, 64)
    assert caught.value.status == 503 and caught.value.retry_after == 1
    with pytest.raises(QueueTimeout):
        await slots.acquire(frontend, 0, 64)
    waiters = [asyncio.create_task(slots.acquire(frontend, 5.0, 64)) for _ in range(3)]
    await asyncio.sleep(0.05)
    for task in waiters:
        task.cancel()
    for task in waiters:
        with pytest.raises(asyncio.CancelledError):
            await task
    for slot in held:
        await slot.release()
        await slot.release()  # idempotent
    again = [await slots.acquire(frontend, 0, 64) for _ in range(2)]  # both slots free at once
    with pytest.raises(QueueTimeout):
        await slots.acquire(frontend, 0, 64)
    for slot in again:
        await slot.release()
    assert await backend.leftovers() == []


async def test_cancellation_racing_a_release_never_leaks_the_slot(backend: Backend) -> None:
    slots = await backend.concurrency()
    frontend = consumer(max_in_flight=1)
    for pause in (0.0, 0.001, 0.005, 0.02):
        holder = await slots.acquire(frontend, 1.0, 64)
        waiter = asyncio.create_task(slots.acquire(frontend, 5.0, 64))
        await asyncio.sleep(0.02)
        releasing = asyncio.create_task(holder.release())
        await asyncio.sleep(pause)
        waiter.cancel()
        await releasing
        try:
            won = await waiter
        except asyncio.CancelledError:
            won = None
        if won is not None:
            await won.release()
        fresh = await slots.acquire(frontend, 1.0, 64)  # the slot came back (a give-back may take a moment)
        await fresh.release()
    await asyncio.sleep(0.05)
    assert await backend.leftovers() == []


async def test_a_consumer_without_max_in_flight_is_never_held(backend: Backend) -> None:
    slots = await backend.concurrency()
    free = [await slots.acquire(consumer("free", requests_per_minute=1), 0, 0) for _ in range(100)]
    for slot in free:
        await slot.release()
    assert await backend.leftovers() == []
