"""Time as a port, so admission and timing logic can be tested with a fake clock."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...
