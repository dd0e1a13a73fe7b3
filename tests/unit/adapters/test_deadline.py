"""`Deadline` (and each use of `Deadlines`) behaves as `asyncio.timeout` does: its own expiry is
a TimeoutError, anyone else's cancellation stays a CancelledError, and nothing fires after the
block."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from adapters.deadline import Deadline, Deadlines, SharedDeadline

Make = Callable[[float], "Deadline | SharedDeadline"]
KINDS = pytest.mark.parametrize("make", [Deadline, lambda delay: Deadlines(delay).start()], ids=["own", "shared"])


def on_both_loops(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The gateway serves on uvloop; the tests run on both loops."""
    asyncio.run(test())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())


@KINDS
def test_the_deadline_fires_as_timeout_error(make: Make) -> None:
    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            with make(0.01) as deadline:
                await asyncio.sleep(5)
        assert deadline.expired
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # its cancellation was taken back
        await asyncio.sleep(0)  # and is not delivered again

    on_both_loops(scenario)


@KINDS
def test_a_block_that_ends_in_time_is_untouched_and_leaves_no_timer(make: Make) -> None:
    async def scenario() -> None:
        with make(0.05) as deadline:
            await asyncio.sleep(0)
            result = 42
        assert result == 42 and not deadline.expired
        await asyncio.sleep(0.15)  # past the deadline: the dropped timer never cancels the task
        assert not deadline.expired
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    on_both_loops(scenario)


@KINDS
def test_an_outside_cancel_during_the_wait_propagates(make: Make) -> None:
    async def scenario() -> None:
        entered = asyncio.Event()

        async def waiter() -> None:
            with make(5):
                entered.set()
                await asyncio.sleep(5)

        task = asyncio.ensure_future(waiter())
        await entered.wait()
        task.cancel()  # e.g. the client hung up
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    on_both_loops(scenario)


@KINDS
def test_an_outside_cancel_is_not_swallowed_when_the_deadline_also_expired(make: Make) -> None:
    async def scenario() -> None:
        entered = asyncio.Event()
        deadlines: list[Deadline] = []

        async def waiter() -> None:
            with make(0.01) as deadline:
                deadlines.append(deadline)
                entered.set()
                await asyncio.sleep(5)

        task = asyncio.ensure_future(waiter())
        await entered.wait()
        asyncio.get_running_loop().call_later(0.02, task.cancel)  # e.g. the client hung up
        time.sleep(0.05)  # noqa: ASYNC251  (blocks the loop on purpose: both timers come due in one turn)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and deadlines[0].expired

    on_both_loops(scenario)


@KINDS
def test_an_outside_cancel_before_the_timer_fires_also_propagates(make: Make) -> None:
    async def scenario() -> None:
        async def waiter() -> None:
            with make(0.01):
                try:
                    await asyncio.sleep(5)
                finally:
                    await asyncio.sleep(0.05)  # cleanup that outlives the deadline, while cancelled

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    on_both_loops(scenario)


def test_nested_deadlines_each_report_their_own_expiry() -> None:
    async def scenario() -> None:
        # The inner one expires first: only it turns into TimeoutError; the outer one goes on.
        with Deadline(5) as outer:
            with pytest.raises(TimeoutError):
                with Deadline(0.01) as inner:
                    await asyncio.sleep(5)
            assert inner.expired and not outer.expired
            await asyncio.sleep(0)
        # The outer one expires first: the inner one lets the cancellation through, the outer
        # one turns it into TimeoutError.
        with pytest.raises(TimeoutError):
            with Deadline(0.01) as outer:
                try:
                    with Deadline(5) as inner:
                        await asyncio.sleep(5)
                except TimeoutError:
                    pytest.fail("the inner deadline claimed the outer one's expiry")
        assert outer.expired and not inner.expired
        # Mixed with asyncio.timeout, either way round.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5) as outer_timeout:
                with Deadline(0.01):
                    await asyncio.sleep(5)
        assert not outer_timeout.expired()
        with pytest.raises(TimeoutError):
            with Deadline(5) as outer:
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(5)
        assert not outer.expired
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    on_both_loops(scenario)


def test_an_exception_from_the_block_passes_through() -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError):
            with Deadline(5):
                await asyncio.sleep(0)
                raise ValueError("boom")

    on_both_loops(scenario)


def test_outside_a_task_it_refuses() -> None:
    with pytest.raises(RuntimeError):
        with Deadline(1):
            pass


def test_shared_deadlines_expire_each_at_its_own_time_on_one_timer() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(0.05)
        ended: list[tuple[int, str]] = []

        async def call(n: int, seconds: float) -> None:
            try:
                with deadlines.start():
                    await asyncio.sleep(seconds)
                ended.append((n, "done"))
            except TimeoutError:
                ended.append((n, "timeout"))

        # Started 0.02 s apart: the quick ones end in time, the slow ones each time out 0.05 s
        # after their own start, whatever ended or is pending around them.
        tasks = []
        for n, seconds in enumerate([5, 0.01, 5, 0.01, 5]):
            tasks.append(asyncio.ensure_future(call(n, seconds)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        assert sorted(ended) == [(0, "timeout"), (1, "done"), (2, "timeout"), (3, "done"), (4, "timeout")]
        assert [n for n, how in ended if how == "timeout"] == [0, 2, 4]  # in the order they began
        assert not deadlines._pending  # nothing left waiting

    on_both_loops(scenario)


def test_shared_deadlines_work_on_each_new_loop() -> None:
    deadlines = Deadlines(0.01)

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            with deadlines.start():
                await asyncio.sleep(5)
        with deadlines.start():  # a timer left for this one on the old loop must not matter
            pass

    for _ in range(2):
        on_both_loops(scenario)
