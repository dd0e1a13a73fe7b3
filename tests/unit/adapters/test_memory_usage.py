"""In-memory consumer counters: the parts only one process has (hand-over, forgetting)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.outbound.memory_usage import UNLIMITED, InMemoryConsumerConcurrency, InMemoryUsageLedger
from domain.consumers import EMPTY_SNAPSHOT, Consumer, ConsumerLimits

T0 = 1_767_225_600.0


def consumer(name: str = "c", **limits: int) -> Consumer:
    return Consumer(name=name, limits=ConsumerLimits(**limits))


async def test_a_slot_handed_to_a_waiter_cancelled_in_the_same_instant_goes_to_the_next() -> None:
    slots = InMemoryConsumerConcurrency()
    c = consumer(max_in_flight=1)
    holder = await slots.acquire(c, 1.0, 64)
    first = asyncio.create_task(slots.acquire(c, 5.0, 64))
    second = asyncio.create_task(slots.acquire(c, 5.0, 64))
    await asyncio.sleep(0)
    assert slots.waiting("c") == 2
    await holder.release()  # hands the slot to `first`, which has not run yet ...
    first.cancel()  # ... and hangs up in the same instant
    with pytest.raises(asyncio.CancelledError):
        await first
    slot = await asyncio.wait_for(second, 1.0)
    assert slots.in_flight("c") == 1
    await slot.release()
    assert (slots.in_flight("c"), slots.waiting("c")) == (0, 0)


async def test_idle_consumers_are_forgotten() -> None:
    now = [T0]
    ledger = InMemoryUsageLedger(lambda: now[0])
    reservations = [await ledger.reserve_tokens(consumer(f"c{i}", tokens_per_minute=100), 50) for i in range(5)]
    assert ledger.tracked() == 5
    for reservation in reservations[:3]:
        await reservation.settle(0)  # refunded: fresh again
    assert ledger.tracked() == 2
    now[0] += 30  # 50 tokens refilled at 100 a minute
    assert ledger.tracked() == 0


async def test_an_unlimited_consumer_gets_the_shared_reservation() -> None:
    ledger = InMemoryUsageLedger()
    assert await ledger.reserve_tokens(consumer(max_in_flight=2), 10) is UNLIMITED
    assert await ledger.reserve_tokens(consumer(requests_per_minute=2), 10) is UNLIMITED  # no token limit
    assert await ledger.take_request(consumer(tokens_per_minute=2)) is EMPTY_SNAPSHOT  # no request limit
    assert ledger.tracked() == 0
