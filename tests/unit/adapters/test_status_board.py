"""The status board's per-upstream shares and fairness index, from the metrics' own counters
(one process), and the gauge it keeps: `gateway_upstream_fairness_index`."""

from __future__ import annotations

from tests.support.metrics import gauge, samples
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.prometheus_metrics import PrometheusMetrics
from adapters.outbound.status_board import StatusBoard
from domain.consumers import Consumer
from domain.records import RequestRecord

CONSUMERS = {"batch": Consumer(name="batch", weight=3), "chat": Consumer(name="chat")}


def _board(auth: bool = True) -> tuple[StatusBoard, PrometheusMetrics, FakeClock]:
    clock = FakeClock()
    gate = InMemoryAdmissionGate({"reasoning": None, "qwen": None}, clock)
    metrics = PrometheusMetrics(gate)
    board = StatusBoard(gate, metrics, clock, ready=lambda: True, backend="memory", workers=1, queue_timeouts={},
                        consumer=CONSUMERS.get if auth else None, output_token_weights={"qwen": 4.0})
    return board, metrics, clock


def _finish(metrics: PrometheusMetrics, consumer: str | None, upstream: str = "reasoning", *, prompt: int = 0,
            output: int = 0, cached: int | None = None, held: float | None = None) -> None:
    metrics.request_finished(RequestRecord(
        request_id="r", surface="v1", route="/v1/chat/completions", method="POST", status=200 if held else 503,
        duration_seconds=1, upstream=upstream, consumer=consumer, input_tokens=prompt, output_tokens=output,
        cached_tokens=cached, slot_seconds=held, queue_wait_seconds=0.5))


def test_shares_and_index_per_upstream_over_the_last_minute() -> None:
    board, metrics, clock = _board()
    board.report()  # the window's first reading, before any request
    clock.advance(1)
    for _ in range(3):
        _finish(metrics, "batch", prompt=100, output=50, cached=60, held=2.0)
    _finish(metrics, "chat", prompt=100, output=50, held=2.0)
    _finish(metrics, "chat", "qwen", prompt=10, output=10, held=1.0)
    clock.advance(1)
    report = board.report()
    reasoning, qwen = report.upstreams
    batch, chat = reasoning.consumers
    assert (batch.name, batch.input_tokens, batch.output_tokens, batch.cached_tokens) == ("batch", 300, 150, 180)
    assert (batch.weighted_tokens, batch.token_share, batch.slot_seconds, batch.slot_share) == (600, 0.75, 6.0, 0.75)
    assert (batch.service, chat.service) == (200, 200)  # weight 3 got 3x: even
    assert reasoning.fairness_index == 1.0
    assert [(c.name, c.weighted_tokens, c.token_share) for c in qwen.consumers] == [("chat", 50, 1.0)]  # weight 4
    assert [c.tokens_last_minute for c in report.consumers] == [450, 170]  # input + output, every upstream
    assert gauge(samples(metrics.render()[1].decode()), "gateway_upstream_fairness_index", "reasoning") == 1.0
    _finish(metrics, "chat")  # chat waited in reasoning's queue and got nothing (a 503 queue-timeout)
    for _ in range(30):  # batch alone for half a minute
        clock.advance(1)
        _finish(metrics, "batch", prompt=100, output=50, held=2.0)
        board.report()
    reasoning = board.report().upstreams[0]
    assert [c.name for c in reasoning.consumers] == ["batch", "chat"] and reasoning.fairness_index < 1.0
    index = gauge(samples(metrics.render()[1].decode()), "gateway_upstream_fairness_index", "reasoning")
    assert index is not None and round(index, 4) == reasoning.fairness_index  # JSON: 4 decimals
    for _ in range(61):  # a minute later only batch is in the window: one consumer
        clock.advance(1)
        _finish(metrics, "batch", prompt=100, output=50, held=2.0)
        board.report()
    reasoning, qwen = board.report().upstreams
    assert [c.name for c in reasoning.consumers] == ["batch"] and reasoning.fairness_index == 1.0
    assert qwen.consumers == [] and qwen.fairness_index == 1.0


def test_keys_off_no_shares_and_the_index_is_one() -> None:
    board, metrics, clock = _board(auth=False)
    board.report()
    clock.advance(1)
    _finish(metrics, None, prompt=100, output=50, held=2.0)  # anonymous: counted nowhere per consumer
    clock.advance(1)
    upstreams = board.report().upstreams
    assert all(u.consumers == [] and u.fairness_index == 1.0 for u in upstreams)
    page = samples(metrics.render()[1].decode())
    assert gauge(page, "gateway_upstream_fairness_index", "qwen") == 1.0
    assert not [s for s in page if s[0] == "gateway_consumer_slot_seconds_total"]
