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

`Deadlines` is the same for many uses of one delay, on one lazy timer (the upstream head's
wait: one per upstream client).

Shared by the inbound edge and the outbound clients (import-linter: `adapters` may use it,
no layer below).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from types import TracebackType


class _Expiry:
    """What both kinds share: the task it cancels when it expires, and asyncio.timeout's rule
    on exit (`TimeoutError` only for its own cancellation)."""

    __slots__ = ("_cancelling", "_expired", "_task")

    def _begin(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False

    def expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def _end(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        # Ours only if no one else asked for a cancellation meanwhile (asyncio.timeout's rule).
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        return self._expired


class Deadline(_Expiry):
    """`with Deadline(seconds):` around awaits in a task: `TimeoutError` once `seconds` passed."""

    __slots__ = ("_delay", "_handle")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._expired = False

    def __enter__(self) -> Deadline:
        self._begin()
        self._handle = asyncio.get_running_loop().call_later(self._delay, self.expire)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._handle.cancel()
        self._end(exc_type, exc)


class Deadlines:
    """`Deadline`s of one fixed delay that share one lazy loop timer: `with deadlines.start():`.

    Per use, `Deadline` sets a loop timer and cancels it (most calls end long before their
    deadline): on the upstream call's head wait, per request. With one delay, deadlines
    expire in the order they began, so they wait in an ordered dict and one timer, set for
    the oldest, fires only when that one may be due: it expires those that are, and is set
    again for the oldest left (or dropped until the next start). Same rule on exit as
    `Deadline` (asyncio.timeout's): `TimeoutError` only for its own cancellation."""

    __slots__ = ("_delay", "_handle", "_loop", "_pending")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._pending: OrderedDict[SharedDeadline, None] = OrderedDict()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's (a new loop sets its own)

    def start(self) -> SharedDeadline:
        return SharedDeadline(self)

    def _add(self, deadline: SharedDeadline, loop: asyncio.AbstractEventLoop) -> None:
        self._pending[deadline] = None
        if self._handle is None or self._loop is not loop:
            self._loop = loop
            self._handle = loop.call_at(deadline.due, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer of a loop before this one's
        self._handle = None
        pending = self._pending
        now = loop.time()
        while pending:
            oldest = next(iter(pending))
            if oldest.due > now:
                self._handle = loop.call_at(oldest.due, self._fire, loop)
                return
            del pending[oldest]
            oldest.expire()


class SharedDeadline(_Expiry):
    """One use of `Deadlines`: a context manager as `Deadline`."""

    __slots__ = ("_clock", "due")

    def __init__(self, clock: Deadlines) -> None:
        self._clock = clock
        self._expired = False

    def __enter__(self) -> SharedDeadline:
        self._begin()
        loop = asyncio.get_running_loop()
        clock = self._clock
        self.due = loop.time() + clock._delay
        clock._add(self, loop)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._clock._pending.pop(self, None)
        self._end(exc_type, exc)
