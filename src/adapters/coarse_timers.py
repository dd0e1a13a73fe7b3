"""Many timeouts on one loop timer, for deadlines that rarely fire.

Every request arms several timeouts (head, body, first byte of the upstream's answer,
the hang-up watcher) and almost never lets one fire. A loop timer each costs more than
it seems: uvloop allocates a libuv timer per `call_later` and frees it a loop turn
after `cancel`, about 2 us a pair, and `asyncio.timeout` twice that; with five per
request that was a tenth of the CPU per proxied request (bench/RESULTS.md).

`CoarseTimers.call_at` instead files the deadline in a set; one ticker, running every
`resolution` seconds while anything is filed, calls back the ones that are due. A
callback runs at most one `resolution` late, and never early. Shared by the inbound and
outbound adapters (it knows nothing of either); one instance per owner and loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class CoarseTimer:
    """A filed deadline; `cancel()` takes it back (idempotent, and harmless once fired)."""

    __slots__ = ("_args", "_callback", "_owner", "when")

    def __init__(self, owner: CoarseTimers, when: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._owner = owner
        self.when = when
        self._callback = callback
        self._args = args

    def cancel(self) -> None:
        self._owner._pending.discard(self)


class CoarseTimers:
    __slots__ = ("_loop", "_pending", "_resolution", "_ticker")

    def __init__(self, resolution: float) -> None:
        self._resolution = resolution
        self._pending: set[CoarseTimer] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> CoarseTimer:
        """Call `callback(*args)` once `delay` seconds have passed (up to `resolution` later)."""
        loop = asyncio.get_running_loop()
        timer = CoarseTimer(self, loop.time() + delay, callback, args)
        self._pending.add(timer)
        if self._ticker is None or self._loop is not loop:
            self._loop = loop
            self._ticker = loop.call_later(self._resolution, self._tick)
        return timer

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        pending = self._pending
        due = [timer for timer in pending if timer.when <= now]
        for timer in due:
            if timer in pending:  # an earlier callback of this tick may have cancelled it
                pending.discard(timer)
                timer._callback(*timer._args)
        self._ticker = loop.call_later(self._resolution, self._tick) if pending else None
