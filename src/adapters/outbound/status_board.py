"""`StatusBoard`: the live status (`ports.status.StatusSource`) from the metrics' own state.

The gauges come from the gate's snapshot, as the metrics' do (with Redis: the shared
figures); the per-minute figures are the growth of the metrics' counters (with several
workers: every worker's) over the last minute, read once a second (`domain.windows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping

from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.consumers import Consumer
from domain.windows import CounterWindow
from ports.admission import AdmissionGate
from ports.clock import Clock
from ports.status import ConsumerStatus, ReplicaStatus, StatusReport, UpstreamStatus

log = logging.getLogger("gateway.status")


class StatusBoard:
    def __init__(
        self, gate: AdmissionGate, metrics: PrometheusMetrics, clock: Clock, *, ready: Callable[[], bool],
        backend: str, workers: int, queue_timeouts: Mapping[str, float],
        consumer: Callable[[str], Consumer | None] | None = None, interval: float = 1.0,
        replica_upstreams: Collection[str] = (),
    ) -> None:
        self._replica_upstreams = frozenset(replica_upstreams)
        self._gate, self._metrics, self._clock = gate, metrics, clock
        self._ready, self._backend, self._workers = ready, backend, workers
        self._timeouts = dict(queue_timeouts)
        self._consumer = consumer  # None: keys off
        self._interval = interval
        self._window: CounterWindow[tuple[str, ...]] = CounterWindow(span=60.0, resolution=interval)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sample_forever(), name="status-sampler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample_forever(self) -> None:
        while True:
            try:
                self._sample()
            except Exception:
                log.exception("status: sampling the counters failed")
            await asyncio.sleep(self._interval)

    def _sample(self) -> dict[tuple[str, ...], float]:
        self._metrics.sync()  # also what another worker's scrape reads of this one
        totals = self._metrics.totals()
        self._window.add(self._clock.now(), totals)
        return totals

    def report(self) -> StatusReport:
        totals = self._sample()
        covered, grown = self._window.growth(self._clock.now(), totals)
        unavailable: dict[str, dict[str, int]] = {}
        consumers: dict[str, dict[str, object]] = {}
        for key, value in sorted(grown.items()):
            what, name, *rest = key
            if what == "unavailable":
                unavailable.setdefault(name, {})[rest[0]] = int(value)
                continue
            entry = consumers.setdefault(name, {"requests": 0, "tokens": 0, "limited": {}})
            if what == "limited":
                entry["limited"][rest[0]] = int(value)  # type: ignore[index]
            else:
                entry[what] = int(value)
        return StatusReport(
            time=time.time(), window_seconds=round(covered, 3), ready=self._ready(), backend=self._backend,
            workers=self._workers, auth=self._consumer is not None,
            upstreams=[self._upstream(name, unavailable.get(name, {})) for name in self._gate.upstreams()],
            consumers=[] if self._consumer is None else [
                self._consumer_status(name, entry) for name, entry in sorted(consumers.items())],
        )

    def _upstream(self, name: str, unavailable: dict[str, int]) -> UpstreamStatus:
        snap = self._gate.snapshot(name)
        return UpstreamStatus(
            name=name, capped=snap.limit is not None, cap=snap.limit, in_flight=snap.in_use,
            queue_depth=snap.queued, queue_limit=snap.queue_limit, queue_timeout_seconds=self._timeouts.get(name),
            oldest_wait_seconds=None if snap.oldest_wait_seconds is None else round(snap.oldest_wait_seconds, 3),
            queued_by_priority={str(p): n for p, n in sorted((snap.queued_by_priority or {}).items())},
            unavailable_last_minute=sum(unavailable.values()), unavailable_by_reason=unavailable,
            replicas=self._replicas(name),
        )

    def _replicas(self, name: str) -> list[ReplicaStatus]:
        """One entry per replica of an upstream with `[endpoints]` (ready, ejected or draining); [] without."""
        if name not in self._replica_upstreams:
            return []
        return [ReplicaStatus(address=r.address, state=r.state.value, in_flight=r.in_flight, limit=r.limit)
                for r in self._gate.replicas(name)]

    def _consumer_status(self, name: str, entry: dict[str, object]) -> ConsumerStatus:
        known = self._consumer(name) if self._consumer is not None else None
        limits = None if known is None else known.limits
        limited: dict[str, int] = entry["limited"]  # type: ignore[assignment]
        return ConsumerStatus(
            name=name, requests_last_minute=int(entry["requests"]),  # type: ignore[call-overload]
            tokens_last_minute=int(entry["tokens"]),  # type: ignore[call-overload]
            limited_last_minute=sum(limited.values()), limited_by_limit=limited,
            requests_per_minute=None if limits is None else limits.requests_per_minute,
            tokens_per_minute=None if limits is None else limits.tokens_per_minute,
        )
