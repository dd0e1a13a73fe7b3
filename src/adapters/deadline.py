"""`Deadline`: `asyncio.timeout` for one await on the request path, for less.

`asyncio.timeout` costs an object with a state machine, two coroutines (its `__aenter__`
and `__aexit__` are `async def`) and a timer per use: per request, for the body's and the
upstream head's timeouts. This is the same mechanism without the coroutines and the state:
a plain context manager that sets one loop timer which cancels the current task, and on
exit tells its own cancellation from anyone else's with `asyncio.timeout`'s rule (Python
3.11): the timer fired, the task's `uncancel()` leaves no more cancel requests than there
were on entry, and the block ended in `CancelledError` -> `TimeoutError`. A cancellation
from outside (a client hang-up cancelling the handler's task) keeps propagating as
`CancelledError`, also when the deadline expired as well. The timer is dropped on exit.

Shared by the inbound edge and the outbound clients (import-linter: `adapters` may use it,
no layer below).
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadline:
    """`with Deadline(seconds):` around awaits in a task: `TimeoutError` once `seconds` passed."""

    __slots__ = ("_cancelling", "_delay", "_expired", "_handle", "_task")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._expired = False

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._handle.cancel()
        # Ours only if no one else asked for a cancellation meanwhile (asyncio.timeout's rule).
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        return self._expired
