"""A stream's items read in one task of their own, with a ping when none came for a while.

The `/llm` stream must send a ping after `interval` seconds without an item, without
cancelling the wait for the item (cancelling would close the service stream). Waiting
for each item in a task of its own, raced against a timeout (`asyncio.wait`), costs a
task, a timer and the wait's bookkeeping per item: per token. `Pump` instead runs one
task per stream that reads the items ahead (at most `AHEAD` of them) and hands them over
in order; the consumer waits on a plain future only when none is there, and one lazy
loop timer per stream wakes it for a ping: a wait notes when it began, and the timer,
firing, either wakes a wait that is `interval` old, sets itself again for the pending
wait's deadline, or is dropped until the next wait.

The task owns the items' stream: however it ends (the last item, a failure, or a
cancellation while it waits for room because the client stopped reading, or for the next
item) it closes that stream itself, so the service's lease is given back when the pump
stops, not when the stream object is collected. `stop` cancels the task once and waits
for that close.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

AHEAD = 16  # items read ahead of the consumer at most (a slow client holds the upstream back)
PING_DUE = object()  # what `next` gives when `interval` passed without an item
END = object()  # what `next` gives after the last item


class Pump:
    __slots__ = ("_error", "_finished", "_interval", "_items", "_loop", "_queue", "_since", "_space", "_stopping",
                 "_task", "_timer", "_waiter")  # fmt: skip

    def __init__(self, items: AsyncIterator[Any], interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._items = items
        self._interval = interval
        self._queue: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the consumer's wait for an item
        self._space: asyncio.Future[None] | None = None  # the reader's wait for room (AHEAD reached)
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0
        self._finished = False
        self._error: BaseException | None = None
        self._stopping = False
        self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        queue = self._queue
        items = self._items
        try:
            async for item in items:
                queue.append(item)
                self._wake()
                if len(queue) >= AHEAD:
                    space = self._space = self._loop.create_future()
                    await space
        except Exception as error:  # delivered after the items before it
            self._error = error
        finally:
            self._finished = True
            self._wake()
            # Cancelled while waiting for room (a client that stopped reading) the items'
            # stream is suspended, not closed: close it here so its slot is given back now.
            # After the last item, or a failure or cancellation inside it, this is a no-op.
            await items.aclose()  # type: ignore[attr-defined]

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def next(self) -> Any:
        """The next item, `PING_DUE` after `interval` without one, `END` after the last; raises
        what the items raised, after the items before it."""
        queue = self._queue
        while not queue:
            if self._finished:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                return END
            waiter = self._waiter = self._loop.create_future()
            self._since = since = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_at(since + self._interval, self._check)
            try:
                await waiter
            finally:
                self._waiter = None
            if not queue and not self._finished:
                return PING_DUE  # woken by the timer
        item = queue.popleft()
        space = self._space
        if space is not None and len(queue) < AHEAD:
            self._space = None
            if not space.done():
                space.set_result(None)
        return item

    def _check(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # the next wait sets the timer again
        due = self._since + self._interval
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self._waiter = None
        waiter.set_result(None)

    async def stop(self) -> None:
        """Stop reading and wait until the items' stream is closed (the consumer is done, at
        its end, early, or because the client left). A cancellation of the caller's wait
        does not stop the close: the task finishes it on its own."""
        self.cancel()
        task = self._task
        if not task.done():
            await asyncio.wait((task,))

    def cancel(self) -> None:
        """Stop reading: the task, cancelled once (not again while it closes the items'
        stream), closes that stream."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if not self._stopping:
            self._stopping = True
            if not self._task.done():
                self._task.cancel()
