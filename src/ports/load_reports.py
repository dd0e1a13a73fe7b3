"""A replica's own account of its load (`domain.load_reports`), read in the background."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from domain.load_reports import LoadReport

LoadListener = Callable[[Mapping[str, LoadReport]], None]
"""Told the fresh report of each replica after every round of reads, and again whenever one
expires between rounds (a replica it held back is then judged on the gateway's counts alone)."""


class LoadReports(Protocol):
    """One upstream's replicas' load, read every `interval` seconds; never per request, never
    blocking the event loop. A replica that cannot say (no such endpoint) is not asked again."""

    interval: float

    def follow(self, ready: Iterable[str]) -> None:
        """The replicas to read: the discovery answer (others' reports are dropped)."""
        ...

    async def start(self, listener: LoadListener | None = None) -> None: ...

    def reports(self) -> Mapping[str, LoadReport]:
        """The fresh report of each replica followed (`domain.load_reports.LoadBook`: a stale
        one is not kept)."""
        ...

    def read_at(self) -> Mapping[str, float]:
        """When each followed replica's load was last read well (kept after its report expired:
        the age of the last good read, for `gateway_endpoint_report_age_seconds`)."""
        ...

    def now(self) -> float:
        """The clock the reports are stamped with."""
        ...

    async def close(self) -> None: ...
