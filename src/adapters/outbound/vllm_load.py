"""`ports.load_reports.LoadReports` from vLLM's own `GET /metrics`.

Every `interval` seconds, one aiohttp GET per followed replica, all at once, on the
replica's own session (`ReplicaSessions`: the same one its chat calls use, one per replica
address). Each read is bounded by `read_timeout(interval)` = min(interval, 2 s) for the
whole exchange and by `MAX_BODY` (1 MiB) for the page: vLLM 0.32's page is about 55 KB and
a busy vLLM serves it slowly (its event loop is generating), so a read may take most of an
interval, but never more (the rounds keep their pace) and never an unbounded page.

The page is parsed with `prometheus_client`'s parser, after keeping only the lines of the
families read (`FAMILIES`): parsing all of vLLM 0.32's page costs about 8 ms of event loop
per replica per read, the three families 0.2 ms (measured here on the 55 KB fixture,
`tests/fixtures/vllm-0.32-metrics.txt`). `vllm:num_requests_running`,
`vllm:num_requests_waiting` and `vllm:num_requests_waiting_by_reason` (`reason="deferred"`)
are summed over the replica's samples: every `engine` (data parallel ranks: "0", "1", ...)
and every `model_name`. KV-cache usage (`vllm:kv_cache_usage_perc`, formerly
`vllm:gpu_cache_usage_perc`) is not read: a vLLM out of KV blocks queues, which
`reason="capacity"` says.

A report is stamped when the page's head arrives (vLLM renders the page before it sends it)
and kept while it is fresh (`domain.load_reports.LoadBook`); a timer drops it the moment it
expires and tells the listener, so a replica is never held back by an old report.

- A 404 means the replica has no metrics: it is never asked again (while it stays known).
- Any other failure (refused, timeout, non-200, too large, unparsable, no vLLM gauges)
  changes nothing: the last good report counts until it expires (fail static). One log
  line when a replica's reads start failing, one when they work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from adapters.outbound.system_clock import SystemClock
from domain.load_reports import LoadBook, LoadReport, window
from domain.replicas import endpoint_of
from ports.clock import Clock
from ports.load_reports import LoadListener

log = logging.getLogger("gateway.load")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
BY_REASON = "vllm:num_requests_waiting_by_reason"
FAMILIES = (RUNNING, WAITING, BY_REASON)
MAX_BODY = 1024 * 1024
MAX_READ_SECONDS = 2.0
_KEEP = tuple(f"{before}{name}{after}" for name in FAMILIES
              for before, after in (("", "{"), ("", " "), ("# HELP ", " "), ("# TYPE ", " ")))  # the families' lines
_HEADERS = {"Accept": "text/plain", "Accept-Encoding": "identity"}
_SLACK = 0.001  # an expiry timer fires this much after the report's end: `expire` then finds it over


def read_timeout(interval: float) -> float:
    """The bound of one read (connect, head and body): min(interval, 2 s)."""
    return min(interval, MAX_READ_SECONDS)


class SessionPool(Protocol):
    """A session per replica address (`openai_compat.ReplicaSessions`)."""

    def acquire(self, replica: str) -> aiohttp.ClientSession: ...

    def release(self, replica: str) -> None: ...


class ScrapeError(ValueError):
    """A page that gives no load (not one that could not be fetched)."""


class VllmGauges(NamedTuple):
    """A replica's scheduler gauges, summed over its engines and model names."""

    running: int
    waiting: int  # every waiting request (`vllm:num_requests_waiting`)
    deferred: int  # of those, waiting for something other than room (`reason="deferred"`)


def parse_load(text: str) -> VllmGauges:
    """The gauges of a vLLM `/metrics` page; ScrapeError when it has none of them.

    `waiting` is vLLM's total; a page without it (but split by reason) gives the sum of the
    reasons. A vLLM older than the split has no `deferred`: all its waiting is for room."""
    kept = "\n".join(line for line in text.splitlines() if line.startswith(_KEEP))
    totals: dict[str, float] = {}
    reasons: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for sample in family.samples:
                if not math.isfinite(sample.value):
                    raise ScrapeError(f"{sample.name} is {sample.value}")
                if sample.name == BY_REASON:
                    reason = sample.labels.get("reason", "")
                    reasons[reason] = reasons.get(reason, 0.0) + sample.value
                elif sample.name in (RUNNING, WAITING):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ScrapeError:
        raise
    except ValueError as exc:
        raise ScrapeError(f"unparsable metrics: {exc}") from None
    if RUNNING not in totals and WAITING not in totals and not reasons:
        raise ScrapeError("no vLLM scheduler gauges")
    waiting = totals.get(WAITING, sum(reasons.values()))
    return VllmGauges(_count(totals.get(RUNNING, 0.0)), _count(waiting), _count(reasons.get("deferred", 0.0)))


def _count(value: float) -> int:
    return max(0, round(value))


class VllmLoadScraper:
    """One upstream's replicas, read in one background task."""

    def __init__(self, upstream: str, sessions: SessionPool, interval: float = 1.0,
                 clock: Clock | None = None) -> None:  # fmt: skip
        self._book = LoadBook(interval)  # checks the interval
        self.upstream = upstream
        self.interval = interval
        self._sessions = sessions
        self._clock = clock or SystemClock()
        self._timeout = aiohttp.ClientTimeout(total=read_timeout(interval))
        self._no_metrics: set[str] = set()  # answered 404: not asked again
        self._failing: set[str] = set()
        self._listener: LoadListener | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the port ---------------------------------------------------------------------

    def follow(self, ready: Iterable[str]) -> None:
        self._book.follow(ready)
        self._no_metrics &= self._book.followed
        self._failing &= self._book.followed

    async def start(self, listener: LoadListener | None = None) -> None:
        if self._task is None:
            self._listener = listener
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"load-{self.upstream}")

    def reports(self) -> Mapping[str, LoadReport]:
        return self._book.fresh(self.now())

    def read_at(self) -> Mapping[str, float]:
        return self._book.read_at()

    def now(self) -> float:
        return self._clock.now()

    async def close(self) -> None:
        self._disarm()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the rounds -------------------------------------------------------------------

    async def read_round(self) -> None:
        """One round: every followed replica that has metrics, at once."""
        targets = sorted(self._book.followed - self._no_metrics)
        await asyncio.gather(*(self._read(replica) for replica in targets))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            await self.read_round()
            self._tell()
            next_round = max(next_round + self.interval, loop.time())  # never a burst after a stall
            await asyncio.sleep(next_round - loop.time())

    def _tell(self) -> None:
        """The fresh reports to the listener; the timer set for the next one to expire."""
        reports = self._book.fresh(self.now())
        if self._listener is not None:
            self._listener(reports)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        when = self._book.next_expiry()
        if when is not None and self._task is not None:
            delay = max(0.0, when - self.now()) + _SLACK
            self._expiry = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self._expiry = None
        if self._book.expire(self.now()):
            self._tell()  # a replica it held back is judged on the gateway's own counts from now on
        else:
            self._arm()

    def _disarm(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    async def _read(self, replica: str) -> None:
        session = self._sessions.acquire(replica)
        try:
            async with session.get(replica + "/metrics", headers=_HEADERS, timeout=self._timeout,
                                   allow_redirects=False) as resp:  # fmt: skip
                at = self.now()
                if resp.status == 404:
                    self._no_metrics.add(replica)
                    self._book.forget(replica)
                    log.info("upstream %s replica %s has no /metrics (404): its load is not read",
                             self.upstream, endpoint_of(replica))  # fmt: skip
                    return
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}")
                body = await _read_bounded(resp)
            gauges = parse_load(body.decode("utf-8", "replace"))
        except (aiohttp.ClientError, TimeoutError, ScrapeError) as exc:
            if replica not in self._failing:
                self._failing.add(replica)
                log.warning("upstream %s replica %s: reading its load failed (%s); its last report counts "
                            "until it is %g s old", self.upstream, endpoint_of(replica),
                            str(exc) or type(exc).__name__, window(self.interval))  # fmt: skip
            return
        finally:
            self._sessions.release(replica)
        self._book.record(replica, LoadReport(running=gauges.running, waiting=gauges.waiting,
                                              deferred=gauges.deferred, at=at))  # fmt: skip
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
