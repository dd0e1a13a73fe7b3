"""`ports.load_reports.LoadReports` from vLLM's own `GET /metrics`.

Every `interval` seconds, one aiohttp GET per followed replica, all at once, each bounded
by half the interval, on the replica's own session (`ReplicaSessions`: the same one its
chat calls use, one per replica address). The Prometheus text is parsed with
`prometheus_client`'s parser; `vllm:num_requests_running` and `vllm:num_requests_waiting`
are summed over the replica's `model_name` labels. Before parsing, only the lines of those
two families are kept: vLLM's page is tens of kilobytes of histograms, and parsing all of it
costs about 20 ms of event loop per replica per second (measured on a 69 KB page), the two
families 0.4 ms.

- A 404 means the replica has no metrics: it is never asked again (while it stays known).
- Any other failure (refused, timeout, non-200, too large, unparsable, no vLLM gauges)
  is ignored: the last good report stays and ages out (`domain.load_reports`: fail
  static). One log line when a replica's reads start failing, one when they work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from domain.load_reports import LoadReport
from domain.replicas import endpoint_of
from ports.load_reports import RoundListener

log = logging.getLogger("gateway.load")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
MAX_BODY = 4 * 1024 * 1024
_KEEP = (RUNNING, WAITING, f"# HELP {RUNNING}", f"# TYPE {RUNNING}", f"# HELP {WAITING}", f"# TYPE {WAITING}")
_HEADERS = {"Accept": "text/plain", "Accept-Encoding": "identity"}


class SessionPool(Protocol):
    """A session per replica address (`openai_compat.ReplicaSessions`)."""

    def acquire(self, replica: str) -> aiohttp.ClientSession: ...

    def release(self, replica: str) -> None: ...


class ScrapeError(ValueError):
    """A page that gives no load (not one that could not be fetched)."""


def parse_load(text: str) -> tuple[int, int]:
    """(running, waiting) summed over every `model_name`; ScrapeError when the page has neither."""
    kept = "\n".join(line for line in text.splitlines() if line.startswith(_KEEP))
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            if family.name in (RUNNING, WAITING):
                for sample in family.samples:
                    if sample.name == family.name:
                        totals[family.name] = totals.get(family.name, 0.0) + sample.value
    except ValueError as exc:
        raise ScrapeError(f"unparsable metrics: {exc}") from None
    if RUNNING not in totals and WAITING not in totals:
        raise ScrapeError("no vLLM scheduler gauges")
    return int(totals.get(RUNNING, 0)), int(totals.get(WAITING, 0))


class VllmLoadScraper:
    """One upstream's replicas, read in one background task."""

    def __init__(self, upstream: str, sessions: SessionPool, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if not interval > 0:
            raise ValueError("interval must be > 0")
        self.upstream = upstream
        self.interval = interval
        self._sessions = sessions
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=interval / 2)
        self._followed: frozenset[str] = frozenset()
        self._reports: dict[str, LoadReport] = {}
        self._no_metrics: set[str] = set()  # answered 404: not asked again
        self._failing: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    # -- the port ---------------------------------------------------------------------

    def follow(self, ready: Iterable[str]) -> None:
        self._followed = frozenset(ready)
        for gone in [a for a in self._reports if a not in self._followed]:
            del self._reports[gone]
        self._no_metrics &= self._followed
        self._failing &= self._followed

    async def start(self, listener: RoundListener | None = None) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(listener), name=f"load-{self.upstream}")

    def reports(self) -> Mapping[str, LoadReport]:
        return self._reports

    def now(self) -> float:
        return self._clock()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the rounds -------------------------------------------------------------------

    async def read_round(self) -> None:
        """One round: every followed replica that has metrics, at once."""
        targets = sorted(self._followed - self._no_metrics)
        await asyncio.gather(*(self._read(replica) for replica in targets))

    async def _run(self, listener: RoundListener | None) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            await self.read_round()
            if listener is not None:
                listener(self._reports)
            next_round = max(next_round + self.interval, loop.time())  # never a burst after a stall
            await asyncio.sleep(next_round - loop.time())

    async def _read(self, replica: str) -> None:
        session = self._sessions.acquire(replica)
        try:
            async with session.get(replica + "/metrics", headers=_HEADERS, timeout=self._timeout,
                                   allow_redirects=False) as resp:  # fmt: skip
                if resp.status == 404:
                    self._no_metrics.add(replica)
                    log.info("upstream %s replica %s has no /metrics (404): its load is not read",
                             self.upstream, endpoint_of(replica))  # fmt: skip
                    return
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}")
                body = await _read_bounded(resp)
            running, waiting = parse_load(body.decode("utf-8", "replace"))
        except (aiohttp.ClientError, TimeoutError, ScrapeError) as exc:
            if replica not in self._failing:
                self._failing.add(replica)
                log.warning("upstream %s replica %s: reading its load failed (%s); its last report ages out",
                            self.upstream, endpoint_of(replica), str(exc) or type(exc).__name__)  # fmt: skip
            return
        finally:
            self._sessions.release(replica)
        if replica in self._followed:  # it may have left discovery meanwhile
            self._reports[replica] = LoadReport(running=running, waiting=waiting, at=self._clock())
        if replica in self._failing:
            self._failing.discard(replica)
            log.info("upstream %s replica %s: its load is read again", self.upstream, endpoint_of(replica))


async def _read_bounded(resp: aiohttp.ClientResponse) -> bytes:
    if (resp.content_length or 0) > MAX_BODY:
        raise ScrapeError("metrics page too large")
    parts: list[bytes] = []
    size = 0
    while chunk := await resp.content.readany():
        size += len(chunk)
        if size > MAX_BODY:
            raise ScrapeError("metrics page too large")
        parts.append(chunk)
    return b"".join(parts)
