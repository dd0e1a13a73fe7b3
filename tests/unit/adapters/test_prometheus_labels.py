"""Metric labels come from configuration, never from what a client sends (issue 19)."""

from __future__ import annotations

from tests.support.metrics import samples
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate import InMemoryAdmissionGate
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.records import RequestRecord


def test_the_model_label_is_the_configured_name_never_the_clients() -> None:
    """Issue 19: a client choosing alias names must not add `gateway_tokens_total` series."""
    metrics = PrometheusMetrics(InMemoryAdmissionGate({}, FakeClock()))
    for i in range(50):
        metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST",
                                               status=200, duration_seconds=1, upstream="up",
                                               model=f"claude-sonnet-{i}", upstream_model="m",
                                               input_tokens=2, output_tokens=3))
    metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST", status=404,
                                           duration_seconds=1, model="unknown-model", input_tokens=1))
    tokens = [(labels, v) for name, labels, v in samples(metrics.render()[1].decode())
              if name == "gateway_tokens_total"]
    assert sorted((labels["model"], labels["direction"], v) for labels, v in tokens) == [
        ("m", "input", 100.0), ("m", "output", 150.0)]
