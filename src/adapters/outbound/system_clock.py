"""The real clock: `time.monotonic`, the clock asyncio's own timers use."""

from __future__ import annotations

import time


class SystemClock:
    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()
