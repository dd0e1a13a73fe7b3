"""Hostile `/v1` bodies against a real gateway: every answer is a success or a 4xx problem
document; never a 5xx, never a dropped connection. Fixed seed and budget (CI)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from tests.contract.fuzz.edge import Edge, check_openai
from tests.contract.fuzz.strategies import garbage, openai_body

FUZZ = settings(
    max_examples=300, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@FUZZ
@given(body=openai_body())
def test_hostile_chat_bodies(edge: Edge, body: bytes) -> None:
    check_openai(edge.post("/v1/chat/completions", body))


@settings(FUZZ, max_examples=60)
@given(body=garbage())
def test_garbage_bodies(edge: Edge, body: bytes) -> None:
    check_openai(edge.post("/v1/chat/completions", body))


def test_the_gateway_survived(edge: Edge) -> None:
    reply = edge.request("GET", "/v1/models")
    check_openai(reply)
    assert reply.status == 200
    assert "Traceback" not in edge.gateway.text() and "unhandled error" not in edge.gateway.text()
