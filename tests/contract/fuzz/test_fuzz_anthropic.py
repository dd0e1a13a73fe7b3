"""Hostile `/llm` bodies against a real gateway: every answer is a success or a 4xx in the
Anthropic error shape (a stream ends with `message_stop` or `error`); never a 5xx, never
a dropped connection. Fixed seed and budget (CI)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from tests.contract.fuzz.edge import Edge, check_anthropic
from tests.contract.fuzz.strategies import anthropic_body, garbage

FUZZ = settings(
    max_examples=300, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@FUZZ
@given(body=anthropic_body())
def test_hostile_message_bodies(edge: Edge, body: bytes) -> None:
    check_anthropic(edge.post("/llm/v1/messages", body))


@settings(FUZZ, max_examples=100)
@given(body=anthropic_body(count_tokens=True))
def test_hostile_count_tokens_bodies(edge: Edge, body: bytes) -> None:
    check_anthropic(edge.post("/llm/v1/messages/count_tokens", body))


@settings(FUZZ, max_examples=60)
@given(body=garbage())
def test_garbage_bodies(edge: Edge, body: bytes) -> None:
    check_anthropic(edge.post("/llm/v1/messages", body))


def test_the_gateway_survived(edge: Edge) -> None:
    reply = edge.request("GET", "/llm/v1/models")
    check_anthropic(reply)
    assert reply.status == 200
    assert "Traceback" not in edge.gateway.text() and "unhandled error" not in edge.gateway.text()
