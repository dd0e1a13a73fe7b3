"""The upstream connection of an `OpenAICompatClient` call (against `scripted_upstream.py`):
a stream read to its end gives it back to the pool, even when its body ends after `[DONE]`;
a consumer that leaves early, is cancelled or hangs up closes it, which aborts the generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from tests.unit.outbound.scripted_upstream import Upstream, collect, request, scripted_upstream

from domain.canonical import Finish


@pytest.fixture
async def up() -> AsyncIterator[Upstream]:
    async with scripted_upstream() as state:
        yield state


async def test_finished_stream_returns_its_connection_to_the_pool(up: Upstream) -> None:
    c = up.client()
    await collect(c, request("stream"))
    await collect(c, request("stream"))
    assert up.peers[0] == up.peers[1]


async def test_done_ends_the_stream_before_the_body_ends(up: Upstream) -> None:
    """The consumer's stream ends at [DONE]; an upstream that then keeps its body open
    for 30 s loses the connection after the grace period instead of holding it."""
    c = up.client()
    started = asyncio.get_running_loop().time()
    chunks = await collect(c, request("done_then_hold"))
    assert asyncio.get_running_loop().time() - started < 0.5
    assert Finish(reason="end_turn") in [e for chunk in chunks for e in chunk.events]
    await asyncio.wait_for(up.disconnected.wait(), 3)


async def test_a_body_that_ends_after_done_still_returns_its_connection(up: Upstream) -> None:
    c = up.client()
    started = asyncio.get_running_loop().time()
    await collect(c, request("done_then_end"))
    assert asyncio.get_running_loop().time() - started < 0.15  # not held up by the end 0.2 s later
    await asyncio.sleep(0.4)  # the end has arrived: aiohttp pooled the connection
    await collect(c, request("stream"))
    assert up.peers[0] == up.peers[1]


async def test_cancelling_the_consumer_aborts_the_upstream(up: Upstream) -> None:
    flowing = asyncio.Event()

    async def consume() -> None:
        async with up.client().open_stream(request("endless")) as chunks:
            async for _ in chunks:
                flowing.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(flowing.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(up.disconnected.wait(), 2)


async def test_leaving_the_stream_early_aborts_the_upstream(up: Upstream) -> None:
    async with up.client().open_stream(request("endless")) as chunks:
        async for _ in chunks:
            break
    await asyncio.wait_for(up.disconnected.wait(), 2)


async def test_a_hang_up_during_a_heartbeat_wait_still_aborts_the_upstream(up: Upstream) -> None:
    beats = 0

    async def consume() -> None:
        nonlocal beats
        async with up.client().open_stream(request("endless_slow"), heartbeat=0.05) as reads:
            async for batch in reads:
                beats += not batch

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert beats >= 2  # the heartbeats' cancellations were taken back; the hang-up's was not
    await asyncio.wait_for(up.disconnected.wait(), 2)
