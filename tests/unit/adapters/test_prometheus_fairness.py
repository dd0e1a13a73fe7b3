"""Metrics of fair queueing: queue depth per priority, queue wait per consumer."""

from __future__ import annotations

from tests.support.metrics import samples
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from domain.records import RequestRecord


async def test_depth_per_priority_beside_the_unchanged_total_and_wait_per_consumer() -> None:
    policy = AdmissionPolicy(max_in_flight=1, queue_depth=8, queue_timeout_seconds=30, fairness="fair")
    gate = InMemoryAdmissionGate({"up": policy}, FakeClock())
    metrics = PrometheusMetrics(gate)
    await gate.enter("up")
    for consumer in (Consumer(name="a"), Consumer(name="a"), Consumer(name="vip", priority=10)):
        await gate.enter("up", consumer)
    for consumer in ("a", None):  # None: auth off, the anonymous consumer
        metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST",
                                               status=200, duration_seconds=1, upstream="up",
                                               queue_wait_seconds=0.5, consumer=consumer))
    page = samples(metrics.render()[1].decode())
    assert [(labels, v) for name, labels, v in page if name == "gateway_upstream_queue_depth"] == [
        ({"upstream": "up"}, 3.0)]
    assert {labels["priority"]: v for name, labels, v in page
            if name == "gateway_upstream_queue_depth_by_priority"} == {"0": 2.0, "10": 1.0}
    assert {labels["consumer"]: v for name, labels, v in page
            if name == "gateway_queue_wait_seconds_count"} == {"a": 1.0, "anonymous": 1.0}
