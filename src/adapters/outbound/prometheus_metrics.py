"""Prometheus metrics: admission gauges read from the gate, request metrics from records.

Gauges are collected at scrape time from `AdmissionGate.snapshot`, so they show the
gate's state (shared state, with a shared ledger) rather than a copy kept in step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from domain.consumers import ANONYMOUS
from domain.records import RequestRecord
from ports.admission import AdmissionGate

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _GateCollector(Collector):
    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
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
        outcomes = CounterMetricFamily(
            "gateway_admission", "Admission outcomes", labels=["upstream", "outcome"])
        for upstream in self._gate.upstreams():
            snap = self._gate.snapshot(upstream)
            in_use.add_metric([upstream], snap.in_use)
            depth.add_metric([upstream], snap.queued)
            for priority, count in sorted((snap.queued_by_priority or {}).items()):
                by_priority.add_metric([upstream, str(priority)], count)
            if snap.limit is not None:
                limit.add_metric([upstream], snap.limit)
            if snap.queue_limit is not None:
                queue_limit.add_metric([upstream], snap.queue_limit)
            for outcome, count in self._gate.counters(upstream).items():  # type: ignore[attr-defined]
                outcomes.add_metric([upstream, outcome], count)
        yield from (in_use, limit, depth, by_priority, queue_limit, outcomes)


class PrometheusMetrics:
    """Owns one registry; `request_finished` makes it a `RequestObserver`."""

    def __init__(self, gate: AdmissionGate) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_GateCollector(gate))
        r = self.registry
        self._requests = Counter(
            "gateway_requests", "Finished requests", ["surface", "route", "status"], registry=r)
        self._duration = Histogram(
            "gateway_request_duration_seconds", "Request duration", ["upstream"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self._queue_wait = Histogram(
            "gateway_queue_wait_seconds", "Time spent waiting for a slot", ["upstream", "consumer"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self._ttft = Histogram(
            "gateway_time_to_first_token_seconds", "Time to the first streamed token", ["upstream"],
            buckets=_LATENCY_BUCKETS, registry=r)
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
        self._request_children: dict[tuple[str, str, int], Any] = {}
        self._upstream_children: dict[str, tuple[Any, Any]] = {}
        self._wait_children: dict[tuple[str, str], Any] = {}  # (upstream, consumer)
        self._token_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def request_started(self, record: RequestRecord, headers: list[tuple[bytes, bytes]]) -> object:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        key = (record.surface, record.route, record.status)
        requests = self._request_children.get(key)
        if requests is None:
            requests = self._request_children[key] = self._requests.labels(key[0], key[1], str(key[2]))
        requests.inc()
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
        if record.queue_wait_seconds is not None:
            who = (upstream, record.consumer or ANONYMOUS.name)
            queue_wait = self._wait_children.get(who)
            if queue_wait is None:
                queue_wait = self._wait_children[who] = self._queue_wait.labels(*who)
            queue_wait.observe(record.queue_wait_seconds)
        if record.first_token_seconds is not None:
            ttft.observe(record.first_token_seconds)
        if record.input_tokens or record.output_tokens:
            model = record.model or ""
            tokens = self._token_children.get((upstream, model))
            if tokens is None:
                tokens = self._token_children[upstream, model] = (
                    self._tokens.labels(upstream, model, "input"), self._tokens.labels(upstream, model, "output"))
            if record.input_tokens:
                tokens[0].inc(record.input_tokens)
            if record.output_tokens:
                tokens[1].inc(record.output_tokens)
        if record.error_kind is not None:
            self._upstream_errors.labels(upstream, record.error_kind).inc()

    def _consumer_finished(self, record: RequestRecord, consumer: str) -> None:
        self._consumer_requests.labels(consumer, record.surface, str(record.status)).inc()
        if record.input_tokens:
            self._consumer_tokens.labels(consumer, "prompt").inc(record.input_tokens)
        if record.output_tokens:
            self._consumer_tokens.labels(consumer, "completion").inc(record.output_tokens)
        if record.rate_limit is not None:
            self._rate_limited.labels(consumer, record.rate_limit).inc()

    def render(self) -> tuple[bytes, bytes]:
        return CONTENT_TYPE_LATEST.encode(), generate_latest(self.registry)
