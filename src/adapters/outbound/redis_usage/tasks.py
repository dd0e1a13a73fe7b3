"""Redis calls run as tasks of their own: a hang-up cancels only the wait for them, never
redis-py mid-command (which can corrupt a pooled connection), and `close` can wait for
the ones still on their way."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Detached:
    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    async def wait(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # seen: whoever awaited it may have been cancelled first
