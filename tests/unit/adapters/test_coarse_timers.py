"""`CoarseTimers`: one loop timer for many deadlines, never early, at most a resolution late."""

from __future__ import annotations

import asyncio

from adapters.coarse_timers import CoarseTimers

RESOLUTION = 0.02


async def test_fires_once_not_early_and_at_most_a_resolution_late() -> None:
    loop = asyncio.get_running_loop()
    timers, fired = CoarseTimers(RESOLUTION), asyncio.Event()
    began = loop.time()
    at: list[float] = []
    timers.call_later(0.05, lambda: (at.append(loop.time()), fired.set()))
    await asyncio.wait_for(fired.wait(), 1)
    await asyncio.sleep(3 * RESOLUTION)
    assert len(at) == 1
    assert 0.05 <= at[0] - began <= 0.05 + RESOLUTION + 0.03  # + scheduling slack on a busy machine


async def test_a_cancelled_timer_never_fires_and_the_ticker_stops() -> None:
    timers, fired = CoarseTimers(RESOLUTION), []
    timer = timers.call_later(0.01, fired.append, "x")
    timer.cancel()
    timer.cancel()  # idempotent
    await asyncio.sleep(5 * RESOLUTION)
    assert fired == [] and timers._ticker is None  # nothing filed: no loop timer left running


async def test_many_deadlines_fire_in_their_own_ticks() -> None:
    timers, fired = CoarseTimers(RESOLUTION), []
    filed = [timers.call_later(delay, fired.append, delay) for delay in (0.0, 0.03, 0.06, 10.0)]
    await asyncio.sleep(0.2)
    assert sorted(fired) == [0.0, 0.03, 0.06]  # the 10 s one is still filed
    assert timers._ticker is not None
    filed[-1].cancel()
    await asyncio.sleep(2 * RESOLUTION)
    assert timers._ticker is None


async def test_a_callback_may_cancel_another_timer_due_in_the_same_tick() -> None:
    timers, fired = CoarseTimers(RESOLUTION), []
    second = None

    def first() -> None:
        fired.append("first")
        assert second is not None
        second.cancel()

    timers.call_later(0.0, first)
    second = timers.call_later(0.0, fired.append, "second")
    await asyncio.sleep(4 * RESOLUTION)
    assert fired in (["first"], ["second", "first"])  # set order: whichever ran first, never both after a cancel
