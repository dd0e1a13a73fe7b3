"""`Pump`: a `/llm` stream's items read in one task, pings between them, and the items'
stream closed however the pump stops (the slot it holds is given back at once)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from adapters.inbound.anthropic.pump import AHEAD, END, PING_DUE, Pump


class Items:
    """An items stream that notes when it is closed (as the service stream frees its slot)."""

    def __init__(self, count: int, delay: float = 0.0, fail: bool = False) -> None:
        self.closed = asyncio.Event()
        self.produced = 0
        self._gen = self._items(count, delay, fail)

    async def _items(self, count: int, delay: float, fail: bool) -> AsyncIterator[int]:
        try:
            for i in range(count):
                if delay:
                    await asyncio.sleep(delay)
                self.produced += 1
                yield i
            if fail:
                raise RuntimeError("upstream failed")
        finally:
            self.closed.set()

    def __aiter__(self) -> Items:
        return self

    async def __anext__(self) -> int:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()


async def test_items_in_order_then_end() -> None:
    items = Items(40)
    pump = Pump(items, 10.0)
    got = []
    while (item := await pump.next()) is not END:
        got.append(item)
    assert got == list(range(40))
    await pump.stop()
    assert items.closed.is_set()


async def test_a_failure_comes_after_the_items_before_it() -> None:
    pump = Pump(Items(3, fail=True), 10.0)
    assert [await pump.next() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError):
        await pump.next()


async def test_a_ping_when_no_item_came_within_the_interval_without_losing_the_item() -> None:
    items = Items(2, delay=0.12)
    pump = Pump(items, 0.05)
    got = []
    while (item := await pump.next()) is not END:
        got.append(item)
    assert PING_DUE in got
    assert [i for i in got if i is not PING_DUE] == [0, 1]


async def test_a_consumer_that_stops_taking_items_holds_the_reader_back_and_stopping_closes_the_items() -> None:
    """The client stopped reading: the pump reads `AHEAD` items and waits for room; stopping
    it then must close the items' stream (that is what gives the slot back)."""
    items = Items(1_000)
    pump = Pump(items, 10.0)
    assert await pump.next() == 0
    for _ in range(5):
        await asyncio.sleep(0)
    assert items.produced <= AHEAD + 1 and not items.closed.is_set()
    await pump.stop()
    assert items.closed.is_set()


async def test_stopping_while_the_reader_waits_for_an_item_closes_the_items() -> None:
    items = Items(10, delay=5.0)
    pump = Pump(items, 10.0)
    await asyncio.sleep(0)
    await pump.stop()
    assert items.closed.is_set()


async def test_a_cancelled_stop_still_closes_the_items() -> None:
    items = Items(1_000)
    pump = Pump(items, 10.0)
    assert await pump.next() == 0
    waiter = asyncio.ensure_future(pump.stop())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.wait_for(items.closed.wait(), 1.0)
