"""Prometheus metrics: admission gauges read from the gate, request metrics from records.

Gauges are collected at scrape time from `AdmissionGate.snapshot`, so they show the
gate's state (shared state, with a shared ledger) rather than a copy kept in step.

With several worker processes (`multiprocess_dir`: prometheus_client's multiprocess mode,
PROMETHEUS_MULTIPROC_DIR set before prometheus_client is first imported) every counter and
histogram lives in a file per worker and any worker's scrape reads them all. The gate's
gauges stay read from the snapshot at scrape time (with Redis, the shared figures, the same
in every worker), except an uncapped upstream's in-use count, which is per process: each
worker writes its own (a `livesum` gauge, folded into `gateway_upstream_slots_in_use`).
The gate's outcome counts are mirrored into a counter (on every request end and at least
once a second), so they are summed over the workers too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from adapters.outbound.replica_metrics import EndpointMetrics, ReplicaMetrics
from domain.consumers import ANONYMOUS
from domain.errors import OVERLOAD_KINDS
from domain.records import RequestRecord
from ports.admission import AdmissionGate

_MAX_CONSUMER_CHILDREN = 4096  # cached consumer metric children (a cache: labels() stays the truth)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


# Each worker's own open leases on uncapped upstreams (multiprocess mode only; never exported
# under this name: summed into gateway_upstream_slots_in_use).
_OPEN = "gateway_worker_open_leases"
Totals = dict[tuple[str, ...], float]


class _GateCollector(Collector):
    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self.open_leases: dict[str, float] | None = None  # set by _AllWorkers before each collect

    def collect(self) -> Iterator[GaugeMetricFamily]:
        in_use = GaugeMetricFamily(
            "gateway_upstream_slots_in_use", "Requests admitted to the upstream now", labels=["upstream"])
        limit = GaugeMetricFamily(
            "gateway_upstream_slots_limit", "Configured in-flight cap (max_in_flight)", labels=["upstream"])
        depth = GaugeMetricFamily(
            "gateway_upstream_queue_depth", "Requests waiting for a slot now", labels=["upstream"])
        # A family of its own rather than a `priority` label on the one above: a family has one
        # label set in prometheus_client, and mixed series would make `sum(queue_depth)` count twice.
        by_priority = GaugeMetricFamily(
            "gateway_upstream_queue_depth_by_priority", "Requests waiting for a slot now, per consumer priority",
            labels=["upstream", "priority"])
        queue_limit = GaugeMetricFamily(
            "gateway_upstream_queue_limit", "Configured queue depth", labels=["upstream"])
        workers = self.open_leases
        for upstream in self._gate.upstreams():
            snap = self._gate.snapshot(upstream)
            uncapped_here = snap.limit is None and workers is not None
            in_use.add_metric([upstream], workers.get(upstream, 0.0) if uncapped_here else snap.in_use)  # type: ignore[union-attr]
            depth.add_metric([upstream], snap.queued)
            for priority, count in sorted((snap.queued_by_priority or {}).items()):
                by_priority.add_metric([upstream, str(priority)], count)
            if snap.limit is not None:
                limit.add_metric([upstream], snap.limit)
            if snap.queue_limit is not None:
                queue_limit.add_metric([upstream], snap.queue_limit)
        yield from (in_use, limit, depth, by_priority, queue_limit)


class _AllWorkers(Collector):
    """Every worker's counters and histograms (their files), plus the gate's gauges."""

    def __init__(self, directory: str, gates: _GateCollector) -> None:
        self.files = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]  # None: unregistered
        self._gates = gates

    def collect(self) -> Iterator[Metric]:
        open_leases: dict[str, float] = {}
        for family in self.files.collect():  # type: ignore[no-untyped-call]
            if family.name == _OPEN:
                for sample in family.samples:
                    open_leases[sample.labels["upstream"]] = sample.value
                continue
            yield family
        self._gates.open_leases = open_leases
        yield from self._gates.collect()


class _LatencyChild:
    """One label set of a `_Latency`: its buckets' counts (the last one +Inf's) and their sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # the first bucket with value <= le
        self.sum += value


class _Latency(Collector):
    """A labelled histogram counted in this process and exported as prometheus_client's own
    (same name, buckets and series, but `_created`): a `Histogram` child's `observe` takes two
    locks and walks the buckets in Python (~8.8k instructions, measured), per request."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float] = _LATENCY_BUCKETS) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self._bounds = tuple(float(bound) for bound in buckets)
        self._les = [floatToGoString(bound) for bound in self._bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], _LatencyChild] = {}

    def labels(self, *values: str) -> _LatencyChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LatencyChild(self._bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for le, count in zip(self._les, child.counts, strict=False):
                cumulative += count
                buckets.append((le, cumulative))
            buckets.append(("+Inf", cumulative + child.counts[-1]))
            family.add_metric(list(values), buckets, child.sum)
        yield family


def _latency(registry: CollectorRegistry, name: str, documentation: str, labelnames: list[str]) -> _Latency:
    latency = _Latency(name, documentation, labelnames)
    registry.register(latency)
    return latency


def _files_latency(registry: CollectorRegistry, name: str, documentation: str, labelnames: list[str]) -> Histogram:
    return Histogram(name, documentation, labelnames, buckets=_LATENCY_BUCKETS, registry=registry)


class PrometheusMetrics:
    """Owns one registry; `request_finished` makes it a `RequestObserver`.

    `redis_health` (the Redis gate's `health`) adds `gateway_redis_reachable` and
    `gateway_lease_heartbeat_failures_total`; `multiprocess_dir` is set with several workers;
    `replica_upstreams` (those with `[endpoints]`) adds the per-replica series (`EndpointMetrics`,
    and `replicas`: `ReplicaMetrics`).
    """

    def __init__(self, gate: AdmissionGate, *, redis_health: Any = None, multiprocess_dir: str | None = None,
                 replica_upstreams: Sequence[str] = ()) -> None:
        self._gate = gate
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        gates = _GateCollector(gate)
        self._workers: _AllWorkers | None = None
        if multiprocess_dir is None:
            r.register(gates)
            self._page = r
        else:
            self._workers = _AllWorkers(multiprocess_dir, gates)
            self._page = CollectorRegistry(auto_describe=False)
            self._page.register(self._workers)
        self._admission = Counter(
            "gateway_admission", "Admission outcomes", ["upstream", "outcome"], registry=r)
        self._admission_children: dict[tuple[str, str], Any] = {}
        self._mirrored: dict[tuple[str, str], int] = {}  # the gate's counts already added
        self._open = None if multiprocess_dir is None else Gauge(
            _OPEN, "Open leases of this worker on an uncapped upstream", ["upstream"],
            multiprocess_mode="livesum", registry=r)
        self._health = redis_health
        self._heartbeat_failures_seen = 0
        if redis_health is not None:
            self._redis_reachable = Gauge(
                "gateway_redis_reachable", "1 while this process's last Redis call succeeded, else 0",
                multiprocess_mode="livemin", registry=r)
            self._heartbeat_failures = Counter(
                "gateway_lease_heartbeat_failures", "Admission lease renewals that did not reach Redis",
                registry=r)
        self._requests = Counter(
            "gateway_requests", "Finished requests", ["surface", "route", "status"], registry=r)
        # One process: the latency histograms are counted here (`_Latency`); several workers:
        # prometheus_client's, in the files every worker's scrape reads.
        latency = _latency if multiprocess_dir is None else _files_latency
        self._duration = latency(r, "gateway_request_duration_seconds", "Request duration", ["upstream"])
        self._queue_wait = latency(
            r, "gateway_queue_wait_seconds", "Time spent waiting for a slot", ["upstream", "consumer"])
        self._ttft = latency(
            r, "gateway_time_to_first_token_seconds", "Time to the first streamed token", ["upstream"])
        self._tokens = Counter(
            "gateway_tokens", "Tokens processed", ["upstream", "model", "direction"], registry=r)
        self._upstream_errors = Counter(
            "gateway_upstream_errors", "Failed requests by error kind", ["upstream", "kind"], registry=r)
        self._consumer_requests = Counter(
            "gateway_consumer_requests", "Finished requests per consumer (API keys on)",
            ["consumer", "surface", "status"], registry=r)
        self._consumer_tokens = Counter(
            "gateway_consumer_tokens", "Tokens charged to a consumer (prompt | completion)",
            ["consumer", "kind"], registry=r)
        self._rate_limited = Counter(
            "gateway_rate_limited", "Requests refused with 429, by the limit they were over",
            ["consumer", "limit"], registry=r)
        # `labels()` hashes and validates its arguments on every call: the children are
        # looked up once per label tuple instead (the label values come from config and
        # status codes, so these maps stay small).
        # One process: a child's counts are summed here and added to it when read (`_flush`:
        # render, totals), not one locked `inc` each per request; with several workers, at
        # once (the files are what other workers' scrapes read). [child, not yet added]
        self._request_children: dict[tuple[str, str, int], list[Any]] = {}
        self._upstream_children: dict[str, tuple[Any, Any]] = {}
        self._wait_children: dict[tuple[str, str], Any] = {}  # (upstream, consumer)
        self._token_children: dict[tuple[str, str], tuple[list[Any], list[Any]]] = {}  # input, output
        self._endpoints: EndpointMetrics | None = None
        # The replicas' own load and their ejections (`[endpoints]`): fed by bootstrap's wiring.
        self.replicas: ReplicaMetrics | None = None
        if replica_upstreams:
            self._endpoints = EndpointMetrics(gate, replica_upstreams, r, self._page)
            self.replicas = ReplicaMetrics(r, self._page)
        # (consumer, surface, status) -> [the consumer's request counter and its two token
        # counters, then what they have yet to be increased by]: consumers come from the keys
        # file (bounded); cleared (once added) past _MAX_CONSUMER_CHILDREN. One process adds
        # the counts to the counters when they are read (`_flush_consumers`: render, totals),
        # not three locked `inc` per request; with several workers, at once (the files are
        # what other workers' scrapes read).
        self._consumer_children: dict[tuple[str, str, int], list[Any]] = {}

    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        if self._workers is not None and record.upstream is not None:
            self.sync(record.upstream)  # other workers' scrapes read only what is in the files
        key = (record.surface, record.route, record.status)
        requests = self._request_children.get(key)
        if requests is None:
            requests = self._request_children[key] = [self._requests.labels(key[0], key[1], str(key[2])), 0]
        if self._workers is None:
            requests[1] += 1
        else:  # the files now: other workers' scrapes read them
            requests[0].inc()
        if record.consumer is not None:
            self._consumer_finished(record, record.consumer)
        upstream = record.upstream
        if upstream is None:
            return
        children = self._upstream_children.get(upstream)
        if children is None:
            children = self._upstream_children[upstream] = (
                self._duration.labels(upstream), self._ttft.labels(upstream))
        duration, ttft = children
        duration.observe(record.duration_seconds)
        if record.endpoint is not None and self._endpoints is not None:
            self._endpoints.request_sent(upstream, record.endpoint)
        if record.queue_wait_seconds is not None:
            who = (upstream, record.consumer or ANONYMOUS.name)
            queue_wait = self._wait_children.get(who)
            if queue_wait is None:
                queue_wait = self._wait_children[who] = self._queue_wait.labels(*who)
            queue_wait.observe(record.queue_wait_seconds)
        if record.first_token_seconds is not None:
            ttft.observe(record.first_token_seconds)
        if record.input_tokens or record.output_tokens:
            model = record.upstream_model or ""  # configured names only: a bounded label set
            tokens = self._token_children.get((upstream, model))
            if tokens is None:
                tokens = self._token_children[upstream, model] = (
                    [self._tokens.labels(upstream, model, "input"), 0],
                    [self._tokens.labels(upstream, model, "output"), 0])
            if self._workers is None:
                tokens[0][1] += record.input_tokens or 0  # None: an embedding has no output
                tokens[1][1] += record.output_tokens or 0
            else:
                if record.input_tokens:
                    tokens[0][0].inc(record.input_tokens)
                if record.output_tokens:
                    tokens[1][0].inc(record.output_tokens)
        if record.error_kind is not None:
            self._upstream_errors.labels(upstream, record.error_kind).inc()

    def _consumer_finished(self, record: RequestRecord, consumer: str) -> None:
        key = (consumer, record.surface, record.status)
        entry = self._consumer_children.get(key)
        if entry is None:
            if len(self._consumer_children) >= _MAX_CONSUMER_CHILDREN:  # keys files change: stay bounded
                self._flush_consumers()
                self._consumer_children.clear()
            entry = self._consumer_children[key] = [
                self._consumer_requests.labels(consumer, record.surface, str(record.status)),
                self._consumer_tokens.labels(consumer, "prompt"), self._consumer_tokens.labels(consumer, "completion"),
                0, 0, 0]
        if self._workers is not None:  # the files now: other workers' scrapes read them
            entry[0].inc()
            if record.input_tokens:
                entry[1].inc(record.input_tokens)
            if record.output_tokens:
                entry[2].inc(record.output_tokens)
        else:
            entry[3] += 1
            if record.input_tokens:
                entry[4] += record.input_tokens
            if record.output_tokens:
                entry[5] += record.output_tokens
        if record.rate_limit is not None:
            self._rate_limited.labels(consumer, record.rate_limit).inc()

    def _flush(self) -> None:
        """Add the request and token counts not yet added to their counters."""
        for entry in self._request_children.values():
            if entry[1]:
                entry[0].inc(entry[1])
                entry[1] = 0
        for pair in self._token_children.values():
            for entry in pair:
                if entry[1]:
                    entry[0].inc(entry[1])
                    entry[1] = 0

    def _flush_consumers(self) -> None:
        """Add the consumer counts not yet added to their counters."""
        for entry in self._consumer_children.values():
            requests, prompt, completion = entry[3], entry[4], entry[5]
            if requests:
                entry[0].inc(requests)
                entry[3] = 0
            if prompt:
                entry[1].inc(prompt)
                entry[4] = 0
            if completion:
                entry[2].inc(completion)
                entry[5] = 0

    def sync(self, upstream: str | None = None) -> None:
        """Mirror the gate's outcome counts (and Redis health, open leases) into the series."""
        gate = self._gate
        for name in gate.upstreams() if upstream is None else (upstream,):
            for outcome, count in gate.counters(name).items():  # type: ignore[attr-defined]
                key = (name, outcome)
                child = self._admission_children.get(key)
                if child is None:  # every outcome is exported from the start, at 0
                    child = self._admission_children[key] = self._admission.labels(name, outcome)
                grown = count - self._mirrored.get(key, 0)
                if grown > 0:
                    child.inc(grown)
                    self._mirrored[key] = count
            if self._open is not None:
                snap = gate.snapshot(name)
                if snap.limit is None:
                    self._open.labels(name).set(snap.in_use)
        health = self._health
        if health is not None:
            self._redis_reachable.set(1 if health.reachable else 0)
            grown = health.heartbeat_failures - self._heartbeat_failures_seen
            if grown > 0:
                self._heartbeat_failures.inc(grown)
                self._heartbeat_failures_seen = health.heartbeat_failures

    def render(self) -> tuple[bytes, bytes]:
        self.sync()
        self._flush()
        self._flush_consumers()
        return CONTENT_TYPE_LATEST.encode(), generate_latest(self._page)

    def totals(self) -> Totals:
        """The cumulative counts the status page shows per minute (every worker's):
        ("unavailable", upstream, kind), ("requests", consumer), ("tokens", consumer),
        ("limited", consumer, limit)."""
        self._flush()
        self._flush_consumers()
        wanted = {"gateway_upstream_errors", "gateway_consumer_requests", "gateway_consumer_tokens",
                  "gateway_rate_limited"}
        families: Iterable[Metric]
        if self._workers is None:
            families = (f for c in (self._upstream_errors, self._consumer_requests, self._consumer_tokens,
                                    self._rate_limited) for f in c.collect())
        else:
            families = (f for f in self._workers.files.collect() if f.name in wanted)  # type: ignore[no-untyped-call]
        out: Totals = {}
        for family in families:
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue  # _created
                labels = sample.labels
                if family.name == "gateway_upstream_errors":
                    if labels["kind"] not in OVERLOAD_KINDS:
                        continue
                    key: tuple[str, ...] = ("unavailable", labels["upstream"], labels["kind"])
                elif family.name == "gateway_consumer_requests":
                    key = ("requests", labels["consumer"])
                elif family.name == "gateway_consumer_tokens":
                    key = ("tokens", labels["consumer"])
                else:
                    key = ("limited", labels["consumer"], labels["limit"])
                out[key] = out.get(key, 0.0) + sample.value
        return out
