"""Prometheus metrics: admission gauges read from the gate, request metrics from records.

Gauges are collected at scrape time from `AdmissionGate.snapshot` (`prometheus_collectors.py`),
so they show the gate's state (shared state, with a shared ledger) rather than a copy kept in step.

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

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from adapters.outbound.prometheus_collectors import OPEN_LEASES, AllWorkers, FairnessGauges, GateGauges
from adapters.outbound.prometheus_consumers import ConsumerMetrics
from adapters.outbound.prometheus_latency import files_latency, latency
from adapters.outbound.replica_metrics import EndpointMetrics, ReplicaMetrics
from domain.consumers import ANONYMOUS
from domain.errors import OVERLOAD_KINDS
from domain.records import RequestRecord
from ports.admission import AdmissionGate

Totals = dict[tuple[str, ...], float]
# The families `totals` reads (from the files, with several workers).
_TOTALS = frozenset({"gateway_upstream_errors", "gateway_consumer_requests", "gateway_consumer_tokens",
                     "gateway_consumer_slot_seconds", "gateway_queue_wait_seconds", "gateway_rate_limited"})


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
        gates = GateGauges(gate)
        self._workers: AllWorkers | None = None
        if multiprocess_dir is None:
            r.register(gates)
            self._page = r
        else:
            self._workers = AllWorkers(multiprocess_dir, gates)
            self._page = CollectorRegistry(auto_describe=False)
            self._page.register(self._workers)
        self._admission = Counter(
            "gateway_admission", "Admission outcomes", ["upstream", "outcome"], registry=r)
        self._admission_children: dict[tuple[str, str], Any] = {}
        self._mirrored: dict[tuple[str, str], int] = {}  # the gate's counts already added
        self._open = None if multiprocess_dir is None else Gauge(
            OPEN_LEASES, "Open leases of this worker on an uncapped upstream", ["upstream"],
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
        # One process: the latency histograms are counted here (`Latency`); several workers:
        # prometheus_client's, in the files every worker's scrape reads.
        histogram = latency if multiprocess_dir is None else files_latency
        self._duration = histogram(r, "gateway_request_duration_seconds", "Request duration", ["upstream"])
        self._queue_wait = histogram(
            r, "gateway_queue_wait_seconds", "Time spent waiting for a slot", ["upstream", "consumer"])
        self._ttft = histogram(
            r, "gateway_time_to_first_token_seconds", "Time to the first streamed token", ["upstream"])
        self._tokens = Counter(
            "gateway_tokens", "Tokens processed", ["upstream", "model", "direction"], registry=r)
        self._upstream_errors = Counter(
            "gateway_upstream_errors", "Failed requests by error kind", ["upstream", "kind"], registry=r)
        self._consumers = ConsumerMetrics(r, at_once=multiprocess_dir is not None)
        # Computed from the last minute by the status board (`set_fairness`), read at scrape time.
        self._fairness = FairnessGauges(gate)
        self._page.register(self._fairness)
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
            self._consumers.finished(record, record.consumer)
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
        self._consumers.flush()
        return CONTENT_TYPE_LATEST.encode(), generate_latest(self._page)

    def set_fairness(self, upstream: str, index: float) -> None:
        """`gateway_upstream_fairness_index{upstream}` from now on (the status board's, each second)."""
        self._fairness.index[upstream] = index

    def totals(self) -> Totals:
        """The cumulative counts the status page shows per minute (every worker's):
        ("unavailable", upstream, kind), ("requests", consumer), ("tokens", consumer) (input +
        output), ("limited", consumer, limit), and per upstream what each consumer used,
        ("use", upstream, consumer, kind) with kind `input` | `output` | `cached` |
        `slot_seconds`, and ("waited", upstream, consumer): its requests that went through the
        upstream's admission (the queue wait histogram's count), served or not."""
        self._flush()
        self._consumers.flush()
        families: Iterable[Metric]
        if self._workers is None:
            consumers = self._consumers
            families = (f for c in (self._upstream_errors, consumers.requests, consumers.tokens,
                                    consumers.slot_seconds, consumers.rate_limited, self._queue_wait)
                        for f in c.collect())
        else:
            families = (f for f in self._workers.files.collect() if f.name in _TOTALS)  # type: ignore[no-untyped-call]
        out: Totals = {}
        for family in families:
            name = family.name
            for sample in family.samples:
                labels = sample.labels
                if name == "gateway_queue_wait_seconds":
                    if not sample.name.endswith("_count"):
                        continue  # buckets, sum
                    key: tuple[str, ...] = ("waited", labels["upstream"], labels["consumer"])
                elif not sample.name.endswith("_total"):
                    continue  # _created
                elif name == "gateway_upstream_errors":
                    if labels["kind"] not in OVERLOAD_KINDS:
                        continue
                    key = ("unavailable", labels["upstream"], labels["kind"])
                elif name == "gateway_consumer_requests":
                    key = ("requests", labels["consumer"])
                elif name == "gateway_consumer_tokens":
                    consumer, kind = labels["consumer"], labels["kind"]
                    if kind != "cached":  # a part of input: not counted twice
                        charged = ("tokens", consumer)
                        out[charged] = out.get(charged, 0.0) + sample.value
                    key = ("use", labels["upstream"], consumer, kind)
                elif name == "gateway_consumer_slot_seconds":
                    key = ("use", labels["upstream"], labels["consumer"], "slot_seconds")
                else:
                    key = ("limited", labels["consumer"], labels["limit"])
                out[key] = out.get(key, 0.0) + sample.value
        return out
