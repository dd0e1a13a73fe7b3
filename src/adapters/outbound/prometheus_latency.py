"""The gateway's latency histograms: counted in this process, or in prometheus_client's files.

One process counts its histograms itself (`Latency`) and exports them as prometheus_client's
own `Histogram` would; with several workers they are prometheus_client's `Histogram`s, in the
files every worker's scrape reads (`files_latency`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class LatencyChild:
    """One label set of a `Latency`: its buckets' counts (the last one +Inf's) and their sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # the first bucket with value <= le
        self.sum += value


class Latency(Collector):
    """A labelled histogram counted in this process and exported as prometheus_client's own
    (same name, buckets and series, but `_created`): a `Histogram` child's `observe` takes two
    locks and walks the buckets in Python (~8.8k instructions, measured), per request."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self._bounds = tuple(float(bound) for bound in buckets)
        self._les = [floatToGoString(bound) for bound in self._bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], LatencyChild] = {}

    def labels(self, *values: str) -> LatencyChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = LatencyChild(self._bounds)
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


def latency(registry: CollectorRegistry, name: str, documentation: str, labelnames: list[str]) -> Latency:
    """A histogram counted in this process, registered in `registry`."""
    histogram = Latency(name, documentation, labelnames)
    registry.register(histogram)
    return histogram


def files_latency(registry: CollectorRegistry, name: str, documentation: str, labelnames: list[str]) -> Histogram:
    """A histogram in prometheus_client's multiprocess files (several workers)."""
    return Histogram(name, documentation, labelnames, buckets=LATENCY_BUCKETS, registry=registry)
