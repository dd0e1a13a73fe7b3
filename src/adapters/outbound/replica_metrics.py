"""Prometheus series of an upstream's replicas' health and load, in the gateway's registry
(`PrometheusMetrics.registry`): the replicas' own load as last read (`[endpoints]
load_metrics`), read at scrape time, and the ejections counted as they happen."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.replicas import endpoint_of
from ports.load_reports import LoadReports


class _LoadCollector(Collector):
    def __init__(self) -> None:
        self.sources: dict[str, LoadReports] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self.sources:
            return
        reported = GaugeMetricFamily(
            "gateway_endpoint_reported", "A replica's own scheduler gauges (vLLM), as last read",
            labels=["upstream", "endpoint", "kind"])
        age = GaugeMetricFamily(
            "gateway_endpoint_report_age_seconds", "Seconds since a replica's load was last read",
            labels=["upstream", "endpoint"])
        for upstream, source in self.sources.items():
            now = source.now()
            for address, report in sorted(source.reports().items()):
                endpoint = endpoint_of(address)
                reported.add_metric([upstream, endpoint, "running"], report.running)
                reported.add_metric([upstream, endpoint, "waiting"], report.waiting)
                age.add_metric([upstream, endpoint], max(0.0, now - report.at))
        yield reported
        yield age


class ReplicaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._load = _LoadCollector()
        registry.register(self._load)
        self._ejections = Counter(
            "gateway_endpoint_ejections", "Replicas ejected for consecutive failures", ["upstream", "endpoint"],
            registry=registry)

    def watch_load(self, upstream: str, source: LoadReports) -> None:
        """Export `gateway_endpoint_reported` and `gateway_endpoint_report_age_seconds` for `upstream`."""
        self._load.sources[upstream] = source

    def endpoint_ejected(self, upstream: str, address: str) -> None:
        """Count one ejection of a replica (`gateway_endpoint_ejections_total`)."""
        self._ejections.labels(upstream, endpoint_of(address)).inc()
