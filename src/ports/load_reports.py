"""A replica's own account of its load (`domain.load_reports`), read in the background."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from domain.load_reports import LoadReport

RoundListener = Callable[[Mapping[str, LoadReport]], None]
"""Told the last good report of each replica after every round of reads."""


class LoadReports(Protocol):
    """One upstream's replicas' load, read every `interval` seconds; never per request, never
    blocking the event loop. A replica that cannot say (no such endpoint) is not asked again."""

    interval: float

    def follow(self, ready: Iterable[str]) -> None:
        """The replicas to read: the discovery answer (others' reports are dropped)."""
        ...

    async def start(self, listener: RoundListener | None = None) -> None: ...

    def reports(self) -> Mapping[str, LoadReport]:
        """The last good report of each replica followed (stale ones included: see `fresh`)."""
        ...

    def now(self) -> float:
        """The clock the reports are stamped with."""
        ...

    async def close(self) -> None: ...
