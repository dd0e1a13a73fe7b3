"""What a Prometheus scrape reads at scrape time: the admission gate's gauges, and with several
worker processes every worker's counters and histograms (their files).

The gauges are read from `AdmissionGate.snapshot`, so they show the gate's state (shared
state, with a shared ledger) rather than a copy kept in step. With several workers an
uncapped upstream's in-use count is per process: each worker writes its own open leases
(`OPEN_LEASES`, a `livesum` gauge in the files), folded into `gateway_upstream_slots_in_use`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ports.admission import AdmissionGate

# Each worker's own open leases on uncapped upstreams (multiprocess mode only; never exported
# under this name: summed into gateway_upstream_slots_in_use).
OPEN_LEASES = "gateway_worker_open_leases"


class GateGauges(Collector):
    """The gate's slots and queues per upstream, read at each scrape."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self.open_leases: dict[str, float] | None = None  # set by AllWorkers before each collect

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


class AllWorkers(Collector):
    """Every worker's counters and histograms (their files), plus the gate's gauges."""

    def __init__(self, directory: str, gates: GateGauges) -> None:
        self.files = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]  # None: unregistered
        self._gates = gates

    def collect(self) -> Iterator[Metric]:
        open_leases: dict[str, float] = {}
        for family in self.files.collect():  # type: ignore[no-untyped-call]
            if family.name == OPEN_LEASES:
                for sample in family.samples:
                    open_leases[sample.labels["upstream"]] = sample.value
                continue
            yield family
        self._gates.open_leases = open_leases
        yield from self._gates.collect()


class FairnessGauges(Collector):
    """`gateway_upstream_fairness_index{upstream}`: Jain's index of the consumers' service on each
    upstream over the last minute (`domain.fairness`), as the status board last computed it
    (once a second); 1.0 until then, and with fewer than 2 consumers."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self.index: dict[str, float] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gateway_upstream_fairness_index",
            "Jain's fairness index of the consumers' service on the upstream over the last minute", labels=["upstream"])
        for upstream in self._gate.upstreams():
            family.add_metric([upstream], self.index.get(upstream, 1.0))
        yield family
