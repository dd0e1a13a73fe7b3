"""`StatusBoard`: the live status (`ports.status.StatusSource`) from the metrics' own state.

The gauges come from the gate's snapshot, as the metrics' do (with Redis: the shared
figures); the per-minute figures are the growth of the metrics' counters (with several
workers: every worker's) over the last minute, read once a second (`domain.windows`). From
the same growth, each second, each consumer's share of every upstream and Jain's fairness
index of their service (`domain.fairness`), which also goes to the metrics' gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping

from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.consumers import Consumer
from domain.fairness import DEFAULT_OUTPUT_TOKEN_WEIGHT, Share, Use, shares
from domain.windows import CounterWindow
from ports.admission import AdmissionGate
from ports.clock import Clock
from ports.status import ConsumerShareStatus, ConsumerStatus, ReplicaStatus, StatusReport, UpstreamStatus

Grown = dict[tuple[str, ...], float]
# `PrometheusMetrics.totals`' ("use", upstream, consumer, kind) -> the `Use` field
_USE_FIELDS = {"input": "input_tokens", "output": "output_tokens", "cached": "cached_tokens",
               "slot_seconds": "slot_seconds"}

log = logging.getLogger("gateway.status")


class StatusBoard:
    def __init__(
        self, gate: AdmissionGate, metrics: PrometheusMetrics, clock: Clock, *, ready: Callable[[], bool],
        backend: str, workers: int, queue_timeouts: Mapping[str, float],
        consumer: Callable[[str], Consumer | None] | None = None, interval: float = 1.0,
        replica_upstreams: Collection[str] = (), output_token_weights: Mapping[str, float] | None = None,
    ) -> None:
        self._replica_upstreams = frozenset(replica_upstreams)
        self._gate, self._metrics, self._clock = gate, metrics, clock
        self._ready, self._backend, self._workers = ready, backend, workers
        self._timeouts = dict(queue_timeouts)
        self._consumer = consumer  # None: keys off
        self._output_weights = dict(output_token_weights or {})  # absent: DEFAULT_OUTPUT_TOKEN_WEIGHT
        self._fair: dict[str, tuple[list[Share], float]] = {}  # upstream -> shares, index (last sample)
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

    def _sample(self) -> tuple[float, Grown]:
        """Read the counters into the window; the window's growth, and the fairness figures from it."""
        self._metrics.sync()  # also what another worker's scrape reads of this one
        totals = self._metrics.totals()
        now = self._clock.now()
        self._window.add(now, totals)
        covered, grown = self._window.growth(now, totals)
        self._fair = self._fairness(grown)
        for upstream in self._gate.upstreams():
            self._metrics.set_fairness(upstream, self._fair[upstream][1] if upstream in self._fair else 1.0)
        return covered, grown

    def _fairness(self, grown: Grown) -> dict[str, tuple[list[Share], float]]:
        """Per upstream, each consumer served or waiting there in the window: its share, and the index."""
        named = self._consumer
        if named is None:  # keys off: one anonymous consumer, nothing to share
            return {}
        uses: dict[str, dict[str, Use]] = {}
        for key, value in grown.items():
            what = key[0]
            if what == "use":
                use = uses.setdefault(key[1], {}).setdefault(key[2], Use())
                setattr(use, _USE_FIELDS[key[3]], value)
            elif what == "waited":
                uses.setdefault(key[1], {}).setdefault(key[2], Use())
        out = {}
        for upstream, by_consumer in uses.items():
            weights = {name: known.weight for name in by_consumer if (known := named(name)) is not None}
            output_weight = self._output_weights.get(upstream, DEFAULT_OUTPUT_TOKEN_WEIGHT)
            out[upstream] = shares(by_consumer, weights, output_weight)
        return out

    def report(self) -> StatusReport:
        covered, grown = self._sample()
        unavailable: dict[str, dict[str, int]] = {}
        consumers: dict[str, dict[str, object]] = {}
        for key, value in sorted(grown.items()):
            what, name, *rest = key
            if what == "unavailable":
                unavailable.setdefault(name, {})[rest[0]] = int(value)
                continue
            if what in ("use", "waited"):
                continue  # per upstream: `_fairness`
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
        fair, index = self._fair.get(name, ([], 1.0))
        return UpstreamStatus(
            name=name, capped=snap.limit is not None, cap=snap.limit, in_flight=snap.in_use,
            queue_depth=snap.queued, queue_limit=snap.queue_limit, queue_timeout_seconds=self._timeouts.get(name),
            oldest_wait_seconds=None if snap.oldest_wait_seconds is None else round(snap.oldest_wait_seconds, 3),
            queued_by_priority={str(p): n for p, n in sorted((snap.queued_by_priority or {}).items())},
            unavailable_last_minute=sum(unavailable.values()), unavailable_by_reason=unavailable,
            replicas=self._replicas(name), fairness_index=round(index, 4),
            consumers=[_share_status(share) for share in fair],
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


def _share_status(share: Share) -> ConsumerShareStatus:
    use = share.use
    return ConsumerShareStatus(
        name=share.consumer, input_tokens=int(use.input_tokens), output_tokens=int(use.output_tokens),
        cached_tokens=int(use.cached_tokens), weighted_tokens=round(share.weighted_tokens, 3),
        token_share=round(share.token_share, 4), slot_seconds=round(use.slot_seconds, 3),
        slot_share=round(share.slot_share, 4), service=round(share.service, 3),
    )
