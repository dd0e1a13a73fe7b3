"""Metric labels come from configuration, never from what a client sends."""

from __future__ import annotations

import pytest
from tests.support.metrics import samples
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound import prometheus_consumers
from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from domain.records import RequestRecord


def test_the_model_label_is_the_configured_name_never_the_clients() -> None:
    """A client choosing alias names must not add `gateway_tokens_total` series."""
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


def test_consumer_counts_are_all_there_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process adds a consumer's counts to its counters when they are read (render,
    totals) and before the children are cleared past their bound; none is lost."""
    monkeypatch.setattr(prometheus_consumers, "_MAX_CONSUMER_CHILDREN", 3)
    metrics = PrometheusMetrics(InMemoryAdmissionGate({}, FakeClock()))

    def finish(consumer: str, status: int = 200, upstream: str = "up") -> None:
        metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST",
                                               status=status, duration_seconds=1, consumer=consumer,
                                               upstream=upstream, input_tokens=2, output_tokens=3, cached_tokens=1,
                                               slot_seconds=0.5))

    for _ in range(4):
        finish("a")
    totals = metrics.totals()
    assert totals[("requests", "a")] == 4 and totals[("tokens", "a")] == 20  # input + output, cached not again
    assert totals[("use", "up", "a", "cached")] == 4 and totals[("use", "up", "a", "slot_seconds")] == 2.0
    for name in ("b", "c", "d", "e"):  # past the bound: the children are cleared, counts kept
        finish(name)
        finish("a", 429, upstream=f"up-{name}")
    page = samples(metrics.render()[1].decode())
    requests = {(labels["consumer"], labels["status"]): v for name, labels, v in page
                if name == "gateway_consumer_requests_total"}
    assert requests == {("a", "200"): 4, ("a", "429"): 4, ("b", "200"): 1, ("c", "200"): 1,
                        ("d", "200"): 1, ("e", "200"): 1}
    tokens = {(labels["consumer"], labels["upstream"], labels["kind"]): v for name, labels, v in page
              if name == "gateway_consumer_tokens_total"}
    assert tokens[("a", "up", "input")] == 8 and tokens[("a", "up", "output")] == 12
    assert tokens[("a", "up", "cached")] == 4
    assert tokens[("a", "up-e", "input")] == 2 and tokens[("e", "up", "input")] == 2
    held = {(labels["consumer"], labels["upstream"]): v for name, labels, v in page
            if name == "gateway_consumer_slot_seconds_total"}
    assert held[("a", "up")] == 2.0 and held[("a", "up-b")] == 0.5 and len(held) == 9


def test_only_requests_that_held_a_slot_count_as_use() -> None:
    """Tokens and slot-seconds per consumer come from requests that held a slot: not from a
    token count (`count_tokens` asks the upstream's tokenizer, no GPU), nor anonymous requests."""
    metrics = PrometheusMetrics(InMemoryAdmissionGate({}, FakeClock()))
    record = {"request_id": "r", "surface": "llm", "route": "count_tokens", "method": "POST", "status": 200,
              "duration_seconds": 1, "upstream": "up"}
    metrics.request_finished(RequestRecord(**record, consumer="a", input_tokens=7))  # type: ignore[arg-type]
    metrics.request_finished(RequestRecord(**record, input_tokens=7, slot_seconds=1.0))  # type: ignore[arg-type]
    page = samples(metrics.render()[1].decode())
    assert not [s for s in page if s[0] in ("gateway_consumer_tokens_total", "gateway_consumer_slot_seconds_total")]
    assert ("requests", "a") in metrics.totals()


def test_request_and_token_counts_are_all_there_at_every_scrape() -> None:
    """One process sums the request and token counts and adds them to the counters when the
    page is rendered: each scrape shows every request finished before it, none twice."""
    metrics = PrometheusMetrics(InMemoryAdmissionGate({}, FakeClock()))

    def finish(status: int = 200) -> None:
        metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST",
                                               status=status, duration_seconds=1, upstream="up",
                                               upstream_model="m", input_tokens=2, output_tokens=3))

    def scrape() -> dict[tuple[str, str], float]:
        page = samples(metrics.render()[1].decode())
        out = {(name, labels.get("status") or labels.get("direction", "")): v for name, labels, v in page
               if name in ("gateway_requests_total", "gateway_tokens_total")}
        return out

    for _ in range(3):
        finish()
    finish(502)
    assert scrape() == {("gateway_requests_total", "200"): 3, ("gateway_requests_total", "502"): 1,
                        ("gateway_tokens_total", "input"): 8, ("gateway_tokens_total", "output"): 12}
    finish()
    metrics.request_finished(RequestRecord(request_id="r", surface="v1", route="chat", method="POST",
                                           status=200, duration_seconds=1, upstream="up", upstream_model="m",
                                           input_tokens=5, output_tokens=None))  # an embedding: no output
    assert scrape()[("gateway_requests_total", "200")] == 5 and scrape()[("gateway_tokens_total", "output")] == 15
    assert scrape()[("gateway_tokens_total", "input")] == 15
