"""Consumer counters on Redis across "processes": several ledger / concurrency instances,
each with its own connections (as separate gateway processes have), share ONE set of
limits; the Lua scripts compute what the domain computes; leases, TTLs and a Redis that
is killed and comes back. Needs the Redis at GATEWAY_TEST_REDIS_URL (FAILS without it);
the outage test runs its own redis-server on another loopback port.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from tests.contract.gates.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.contract.gates.test_usage_contract import MIDNIGHT, WallClock, consumer
from tests.support.redis_server import RedisServer

from adapters.outbound.memory_usage import InMemoryUsageLedger
from adapters.outbound.redis_usage import RedisConsumerConcurrency, RedisUsageLedger
from adapters.outbound.redis_usage.scripts import held_key, rate_key
from domain.consumers import EMPTY_SNAPSHOT, Consumer, ConsumerLimits
from domain.errors import AdmissionUnavailable, QueueTimeout, RateLimited


class Made:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.things: list[Any] = []
        self.redis = Redis.from_url(REDIS_URL, decode_responses=True)

    async def ledger(self, url: str = REDIS_URL, **kw: Any) -> RedisUsageLedger:
        ledger = RedisUsageLedger(url, self.prefix, **kw)
        await ledger.start()
        self.things.append(ledger)
        return ledger

    async def slots(self, url: str = REDIS_URL, start: bool = True, **kw: Any) -> RedisConsumerConcurrency:
        slots = RedisConsumerConcurrency(url, self.prefix, **kw)
        if start:
            await slots.start()
        self.things.append(slots)
        return slots


@pytest.fixture
async def made() -> AsyncIterator[Made]:
    await require_redis()
    made = Made(f"gwtest-{uuid.uuid4().hex[:12]}")
    yield made
    for thing in made.things:
        await thing.close()
    await made.redis.aclose()
    await delete_prefix(made.prefix)


async def test_three_ledgers_share_one_request_limit(made: Made) -> None:
    ledgers = [await made.ledger() for _ in range(3)]
    frontend = consumer(requests_per_minute=10)

    async def one(i: int) -> str:
        try:
            await ledgers[i % 3].take_request(frontend)
        except RateLimited as refused:
            assert (refused.retry_after or 0) >= 1
            return "429"
        return "200"

    answers = await asyncio.gather(*(one(i) for i in range(30)))
    assert answers.count("200") == 10 and answers.count("429") == 20


async def test_three_processes_share_one_max_in_flight(made: Made) -> None:
    instances = [await made.slots(recheck_seconds=0.2) for _ in range(3)]
    frontend = consumer(max_in_flight=2)
    current = peak = 0

    async def one(i: int) -> None:
        nonlocal current, peak
        slot = await instances[i % 3].acquire(frontend, 15.0, 64)
        try:
            current += 1
            peak = max(peak, current)
            await asyncio.sleep(0.02)
            current -= 1
        finally:
            await slot.release()

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(10))), 30)
    assert peak == 2
    assert await made.redis.exists(held_key(made.prefix, "frontend")) == 0


async def test_a_release_in_one_process_wakes_a_waiter_in_another_at_once(made: Made) -> None:
    a, b = await made.slots(recheck_seconds=5.0), await made.slots(recheck_seconds=5.0)
    frontend = consumer(max_in_flight=1)
    held = await a.acquire(frontend, 1.0, 64)
    waiting = asyncio.create_task(b.acquire(frontend, 10.0, 64))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await held.release()
    slot = await asyncio.wait_for(waiting, 3.0)
    assert time.monotonic() - started < 0.5  # over pub/sub: the poll would take 5 s
    await slot.release()


async def test_a_dead_processes_slots_lapse_within_its_lease(made: Made) -> None:
    dead = await made.slots(lease_seconds=1.0, start=False)  # never renews: as if it died
    alive = await made.slots(recheck_seconds=0.2)
    frontend = consumer(max_in_flight=2)
    for _ in range(2):
        await dead.acquire(frontend, 1.0, 64)
    started = time.monotonic()
    slot = await alive.acquire(frontend, 5.0, 64)
    assert 0.7 < time.monotonic() - started < 2.0
    await slot.release()


async def test_leases_are_renewed_while_held(made: Made) -> None:
    a = await made.slots(lease_seconds=0.6)
    frontend = consumer(max_in_flight=1)
    held = await a.acquire(frontend, 1.0, 64)
    await asyncio.sleep(1.5)  # well past one lease
    b = await made.slots(lease_seconds=0.6)
    with pytest.raises(QueueTimeout):
        await b.acquire(frontend, 0.3, 64)  # a's slot is still held: its lease was renewed
    assert a.lost == 0
    pttl = await made.redis.pttl(held_key(made.prefix, "frontend"))
    assert 0 < pttl <= 600
    await held.release()
    assert await made.redis.exists(held_key(made.prefix, "frontend")) == 0


async def test_rate_keys_expire_when_they_would_be_fresh_again(made: Made) -> None:
    ledger = await made.ledger()
    await ledger.take_request(consumer("a", requests_per_minute=60))
    pttl = await made.redis.pttl(rate_key(made.prefix, "a"))
    assert 900 < pttl <= 1000  # one request refills in 1 s
    await ledger.reserve_tokens(consumer("d", tokens_per_day=100), 1)
    assert await made.redis.pttl(rate_key(made.prefix, "d")) > 1000  # until UTC midnight
    refunded = await ledger.reserve_tokens(consumer("t", tokens_per_minute=1000), 0)
    assert await made.redis.exists(rate_key(made.prefix, "t")) == 0  # took nothing: nothing stored
    await refunded.settle(0)
    await asyncio.sleep(1.1)
    assert await made.redis.exists(rate_key(made.prefix, "a")) == 0


async def test_hang_ups_mid_call_leave_no_reservation_and_no_slot(made: Made) -> None:
    ledger, slots = await made.ledger(), await made.slots()
    tokens = consumer("tokens", tokens_per_minute=100_000)
    held = consumer("held", max_in_flight=1)
    for i in range(30):
        calls = [asyncio.create_task(ledger.reserve_tokens(tokens, 1000)),
                 asyncio.create_task(slots.acquire(held, 1.0, 64))]
        await asyncio.sleep(0.0002 * (i % 5))
        for call in calls:
            call.cancel()
        for call in calls:
            try:
                entry = await call
            except asyncio.CancelledError:
                continue
            if hasattr(entry, "settle"):
                await entry.settle(0)
            else:
                await entry.release()
    await asyncio.sleep(0.3)  # a give-back still on its way
    assert await made.redis.exists(held_key(made.prefix, "held")) == 0
    probe = await ledger.reserve_tokens(tokens, 0)
    assert probe.snapshot.tokens is not None and probe.snapshot.tokens.remaining >= 99_900  # refunded


async def test_redis_killed_mid_run_fails_limited_consumers_closed_and_recovers(
        made: Made, tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        ledger = await made.ledger(server.url)
        slots = await made.slots(server.url, recheck_seconds=0.2)
        limited = consumer("limited", requests_per_minute=100, tokens_per_minute=10_000, max_in_flight=1)
        unlimited = consumer("unlimited")
        await ledger.take_request(limited)
        await (await ledger.reserve_tokens(limited, 10)).settle(5)
        held = await slots.acquire(limited, 1.0, 64)
        waiting = asyncio.create_task(slots.acquire(limited, 10.0, 64))
        await asyncio.sleep(0.1)
        server.stop()
        started = time.monotonic()
        with pytest.raises(AdmissionUnavailable) as caught:
            await ledger.take_request(limited)
        assert caught.value.status == 503 and caught.value.retry_after == 1
        with pytest.raises(AdmissionUnavailable):
            await ledger.reserve_tokens(limited, 10)
        with pytest.raises(AdmissionUnavailable):
            await waiting  # its next poll found Redis gone
        with pytest.raises(AdmissionUnavailable):
            await slots.acquire(limited, 1.0, 64)
        assert time.monotonic() - started < 5.0
        for _ in range(20):  # unlimited consumers pass without Redis
            assert await ledger.take_request(unlimited) == EMPTY_SNAPSHOT
            await (await ledger.reserve_tokens(unlimited, 100)).settle(100)
            await (await slots.acquire(unlimited, 0, 64)).release()
        await held.release()  # never raises: deferred
        server.start()  # empty: a restarted Redis without persistence
        await asyncio.sleep(0.2)
        taken = await ledger.take_request(limited)
        assert taken.requests is not None and taken.requests.remaining == 99  # the lost counters start afresh
        reservation = await ledger.reserve_tokens(limited, 10)
        await reservation.settle(10)
        slot = await slots.acquire(limited, 1.0, 64)
        await slot.release()
        check = Redis.from_url(server.url, decode_responses=True)
        try:
            assert await check.exists(held_key(made.prefix, "limited")) == 0
        finally:
            await check.aclose()
    finally:
        for thing in made.things:
            await thing.close()
        made.things.clear()
        server.stop()


# -- the Lua scripts against the domain -----------------------------------------------

steps = st.lists(st.tuples(st.sampled_from(["request", "reserve", "settle", "wait"]), st.integers(0, 3000),
                           st.integers(0, 50_000)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rpm=st.one_of(st.none(), st.integers(1, 30)), tpm=st.one_of(st.none(), st.integers(1, 3000)),
       tpd=st.one_of(st.none(), st.integers(1, 9000)), script=steps)
async def test_the_scripts_decide_exactly_as_the_domain(
        made: Made, rpm: int | None, tpm: int | None, tpd: int | None,
        script: list[tuple[str, int, int]]) -> None:
    limits = ConsumerLimits(requests_per_minute=rpm, tokens_per_minute=tpm, tokens_per_day=tpd)
    if not limits.rate_limited:
        return
    who = Consumer(name=uuid.uuid4().hex, limits=limits)
    clock = WallClock(MIDNIGHT + 86_400 - 60)  # the run crosses a UTC midnight
    redis, memory = RedisUsageLedger(REDIS_URL, made.prefix, wall_time=clock), InMemoryUsageLedger(clock)
    try:
        await compare(redis, memory, who, clock, script)
    finally:
        await redis.close()


async def compare(redis: RedisUsageLedger, memory: InMemoryUsageLedger, who: Consumer, clock: WallClock,
                  script: list[tuple[str, int, int]]) -> None:
    open_: list[tuple[Any, Any]] = []
    for op, tokens, ms in script:
        if op == "wait":
            clock.now += ms / 1000
        elif op == "settle" and open_:
            a, b = open_.pop(0)
            await a.settle(tokens)
            await b.settle(tokens)
        elif op in ("request", "reserve"):
            outcomes: list[Any] = []
            for ledger in (redis, memory):
                try:
                    if op == "request":
                        outcomes.append(await ledger.take_request(who))
                    else:
                        outcomes.append(await ledger.reserve_tokens(who, tokens))
                except RateLimited as refused:
                    outcomes.append(refused)
            a, b = outcomes
            if isinstance(a, RateLimited) or isinstance(b, RateLimited):
                assert isinstance(a, RateLimited) and isinstance(b, RateLimited)
                assert (a.limit, a.retry_after, a.snapshot) == (b.limit, b.retry_after, b.snapshot)
            elif op == "request":
                assert a == b  # the snapshots after taking the request
            else:
                assert a.snapshot == b.snapshot
                open_.append((a, b))
