"""Prometheus series of an upstream's replicas, in the gateway's registry (`PrometheusMetrics`).

`EndpointMetrics`: the replicas by state and each one's requests in flight, read from the
gate at scrape time (with Redis, the shared counts), and the requests each replica got.
`ReplicaMetrics`: the replicas' own load while fresh (`[endpoints] load_metrics`) and the age of
each one's last good read, read at scrape time, and the ejections counted as they happen."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from domain.replicas import ReplicaState, endpoint_of
from domain.resume import OUTCOMES
from ports.admission import AdmissionGate
from ports.load_reports import LoadReports

_STATES = (ReplicaState.READY, ReplicaState.DRAINING, ReplicaState.EJECTED)


class _EndpointCollector(Collector):
    def __init__(self, gate: AdmissionGate, upstreams: Sequence[str]) -> None:
        self._gate, self._upstreams = gate, list(upstreams)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = GaugeMetricFamily(
            "gateway_upstream_endpoints", "An upstream's replicas now, by state (ready | draining | ejected)",
            labels=["upstream", "state"])
        in_flight = GaugeMetricFamily(
            "gateway_endpoint_in_flight", "Slots one replica holds for this upstream's requests now",
            labels=["upstream", "endpoint"])
        for upstream in self._upstreams:
            counts = dict.fromkeys(_STATES, 0)
            for replica in self._gate.replicas(upstream):
                counts[replica.state] += 1
                in_flight.add_metric([upstream, endpoint_of(replica.address)], replica.in_flight)
            for state, count in counts.items():
                states.add_metric([upstream, state.value], count)
        yield states
        yield in_flight


class EndpointMetrics:
    """`gateway_upstream_endpoints{upstream,state}`, `gateway_endpoint_in_flight{upstream,endpoint}`
    (gauges on `page`, the registry a scrape reads) and `gateway_endpoint_requests_total{upstream,endpoint}`
    (a counter in `registry`: with several workers, in every worker's files)."""

    def __init__(self, gate: AdmissionGate, upstreams: Sequence[str], registry: CollectorRegistry,
                 page: CollectorRegistry) -> None:
        page.register(_EndpointCollector(gate, upstreams))
        self._requests = Counter(
            "gateway_endpoint_requests", "Requests sent to one replica", ["upstream", "endpoint"], registry=registry)
        self._children: dict[tuple[str, str], Any] = {}

    def request_sent(self, upstream: str, endpoint: str) -> None:
        key = (upstream, endpoint)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= 4096:  # replicas come and go with DNS: the lookup cache stays bounded
                self._children.clear()
            child = self._children[key] = self._requests.labels(upstream, endpoint)
        child.inc()


class _LoadCollector(Collector):
    def __init__(self) -> None:
        self.sources: dict[str, LoadReports] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self.sources:
            return
        reported = GaugeMetricFamily(
            "gateway_endpoint_reported",
            "A replica's own scheduler gauges (vLLM) while the last read is fresh: running, waiting, "
            "deferred (of those waiting, not for room)", labels=["upstream", "endpoint", "kind"])
        age = GaugeMetricFamily(
            "gateway_endpoint_report_age_seconds", "Seconds since a replica's load was last read well",
            labels=["upstream", "endpoint"])
        for upstream, source in self.sources.items():
            now = source.now()
            for address, report in sorted(source.reports().items()):
                endpoint = endpoint_of(address)
                reported.add_metric([upstream, endpoint, "running"], report.running)
                reported.add_metric([upstream, endpoint, "waiting"], report.waiting)
                reported.add_metric([upstream, endpoint, "deferred"], report.deferred)
            for address, at in sorted(source.read_at().items()):
                age.add_metric([upstream, endpoint_of(address)], max(0.0, now - at))
        yield reported
        yield age


class ReplicaMetrics:
    """The load gauges (on `page`, the registry a scrape reads: each process shows the reports it
    read) and `gateway_endpoint_ejections_total` (a counter in `registry`: with several workers,
    in every worker's files)."""

    def __init__(self, registry: CollectorRegistry, page: CollectorRegistry | None = None) -> None:
        self._load = _LoadCollector()
        (page or registry).register(self._load)
        self._ejections = Counter(
            "gateway_endpoint_ejections", "Replicas ejected for consecutive failures", ["upstream", "endpoint"],
            registry=registry)
        self._known: set[tuple[str, str]] = set()
        self._resumes = Counter(
            "gateway_stream_resumes", "Streams broken mid-answer on a replica, by what became of them "
            "(resumed on another replica, not_resumable, failed)", ["upstream", "outcome"], registry=registry)

    def resumes_known(self, upstreams: Iterable[str]) -> None:
        """The upstreams that resume broken streams: their counters exist from the start, at 0."""
        for upstream in upstreams:
            for outcome in OUTCOMES:
                self._resumes.labels(upstream, outcome)

    def stream_resumed(self, upstream: str, outcome: str) -> None:
        """Count one break of a stream (`gateway_stream_resumes_total`) by its `outcome`."""
        self._resumes.labels(upstream, outcome).inc()

    def endpoints_known(self, upstream: str, addresses: Iterable[str]) -> None:
        """Replicas discovery answered: their ejection counters exist from then on, at 0 (so
        `increase()` sees the first one)."""
        for address in addresses:
            key = (upstream, endpoint_of(address))
            if key not in self._known:
                if len(self._known) >= 4096:  # replicas come and go with DNS: the set stays bounded
                    self._known.clear()
                self._known.add(key)
                self._ejections.labels(*key)

    def watch_load(self, upstream: str, source: LoadReports) -> None:
        """Export `gateway_endpoint_reported` and `gateway_endpoint_report_age_seconds` for `upstream`."""
        self._load.sources[upstream] = source

    def endpoint_ejected(self, upstream: str, address: str) -> None:
        """Count one ejection of a replica (`gateway_endpoint_ejections_total`)."""
        self._ejections.labels(upstream, endpoint_of(address)).inc()
