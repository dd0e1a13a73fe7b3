"""The latency histograms one process counts itself are exported exactly as prometheus_client's
own `Histogram` would export the same observations (its `_created` series aside)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.prometheus_latency import LATENCY_BUCKETS, Latency
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.records import RequestRecord

VALUES = [0.0, 0.001, 0.005, 0.0051, 0.025, 0.3, 1, 1.0, 7, 300, 400, 1e9]


def test_the_exposition_is_prometheus_clients_own() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("x_seconds", "doc", ["upstream", "consumer"], buckets=LATENCY_BUCKETS, registry=theirs)
    latency = Latency("x_seconds", "doc", ["upstream", "consumer"])
    ours.register(latency)
    for i, value in enumerate(VALUES):
        labels = ("a", "b") if i % 3 else ("c", "d")
        histogram.labels(*labels).observe(value)
        latency.labels(*labels).observe(value)
    expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
    assert generate_latest(ours).decode().splitlines() == expected


def test_request_metrics_show_the_durations_and_first_tokens() -> None:
    metrics = PrometheusMetrics(InMemoryAdmissionGate({}, FakeClock()))
    for seconds in (0.02, 0.2, 2.0):
        metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST", status=200,
                                               duration_seconds=seconds, upstream="up", first_token_seconds=0.01,
                                               queue_wait_seconds=0.0))
    page = metrics.render()[1].decode()
    assert 'gateway_request_duration_seconds_bucket{le="0.25",upstream="up"} 2.0' in page
    assert 'gateway_request_duration_seconds_count{upstream="up"} 3.0' in page
    assert 'gateway_time_to_first_token_seconds_bucket{le="0.01",upstream="up"} 3.0' in page
    assert 'gateway_queue_wait_seconds_count{consumer="anonymous",upstream="up"} 3.0' in page
