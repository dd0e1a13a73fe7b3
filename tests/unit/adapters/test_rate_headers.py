"""Each dialect's own rate-limit headers, from one `RateSnapshot`."""

from __future__ import annotations

import time
from typing import Any

import pytest
from litestar import Litestar, Request, Response, post
from tests.support import asgi

from adapters.inbound._shared.call import call_of
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.json_answer import json_answer
from adapters.inbound.anthropic import errors as anthropic_errors
from adapters.inbound.anthropic.rate_headers import rate_limit_headers as anthropic_headers
from adapters.inbound.anthropic.rate_headers import rfc3339
from adapters.inbound.openai import errors as openai_errors
from adapters.inbound.openai.rate_headers import duration
from adapters.inbound.openai.rate_headers import rate_limit_headers as openai_headers
from domain.consumers import LimitKind, RateSnapshot, RateState
from domain.errors import RateLimited

SNAPSHOT = RateSnapshot(
    requests=RateState(kind=LimitKind.REQUESTS_PER_MINUTE, limit=600, remaining=599, reset_seconds=0.1),
    tokens=RateState(kind=LimitKind.TOKENS_PER_MINUTE, limit=200000, remaining=150000, reset_seconds=15.0),
)


@pytest.mark.parametrize(("seconds", "text"), [(0.02, "20ms"), (6, "6s"), (6.4, "6s"), (90, "1m30s"),
                                               (7200, "2h0m0s"), (0, "0ms"), (-0.5, "0ms"),
                                               (0.0004, "0ms"), (0.9994, "999ms")])
def test_openai_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_openai_headers() -> None:
    assert dict(openai_headers(SNAPSHOT)) == {
        b"x-ratelimit-limit-requests": b"600", b"x-ratelimit-remaining-requests": b"599",
        b"x-ratelimit-reset-requests": b"100ms", b"x-ratelimit-limit-tokens": b"200000",
        b"x-ratelimit-remaining-tokens": b"150000", b"x-ratelimit-reset-tokens": b"15s",
    }
    assert openai_headers(None) == [] and openai_headers(RateSnapshot()) == []


@pytest.mark.parametrize("snapshot", [SNAPSHOT, RateSnapshot(), RateSnapshot(requests=SNAPSHOT.requests),
                                      RateSnapshot(tokens=SNAPSHOT.tokens)])
def test_openai_headers_in_wire_order(snapshot: RateSnapshot) -> None:
    names = [name for name, _ in openai_headers(snapshot)]
    expected = [b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests", b"x-ratelimit-reset-requests",
                b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens"]
    assert names == expected[:3] * (snapshot.requests is not None) + expected[3:] * (snapshot.tokens is not None)


def test_anthropic_headers_reset_at_an_rfc3339_time() -> None:
    before = time.time()
    headers = dict(anthropic_headers(SNAPSHOT))
    assert headers[b"anthropic-ratelimit-requests-limit"] == b"600"
    assert headers[b"anthropic-ratelimit-tokens-remaining"] == b"150000"
    reset = time.mktime(time.strptime(headers[b"anthropic-ratelimit-tokens-reset"].decode(),
                                      "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert before + 14 <= reset <= time.time() + 15


@pytest.mark.parametrize("snapshot", [SNAPSHOT, RateSnapshot(), RateSnapshot(requests=SNAPSHOT.requests),
                                      RateSnapshot(tokens=SNAPSHOT.tokens)])
def test_anthropic_headers_in_wire_order(snapshot: RateSnapshot) -> None:
    names = [name for name, _ in anthropic_headers(snapshot)]
    expected = [b"anthropic-ratelimit-requests-limit", b"anthropic-ratelimit-requests-remaining",
                b"anthropic-ratelimit-requests-reset", b"anthropic-ratelimit-tokens-limit",
                b"anthropic-ratelimit-tokens-remaining", b"anthropic-ratelimit-tokens-reset"]
    assert names == expected[:3] * (snapshot.requests is not None) + expected[3:] * (snapshot.tokens is not None)
    assert anthropic_headers(None) == []


@pytest.mark.parametrize("epoch", [0, 1.5, 86399.999, 1_764_806_400.25, 4_102_444_799.9])
def test_rfc3339_is_the_whole_utc_second(epoch: float) -> None:
    expected = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    assert rfc3339(epoch) == expected and rfc3339(epoch) == expected  # remembered, the same


def test_429_in_each_surface_shape_with_retry_after_and_the_headers() -> None:
    error = RateLimited(LimitKind.TOKENS_PER_MINUTE, 7, SNAPSHOT)
    status, body, media, headers = openai_errors.ProblemRenderer().render(error, "rid")
    assert status == 429 and media == b"application/problem+json"
    assert b'"code":"rate_limit_exceeded"' in body and b'"type":"tokens"' in body
    assert (b"retry-after", b"7") in headers and (b"x-ratelimit-remaining-tokens", b"150000") in headers
    status, body, _, headers = anthropic_errors.AnthropicErrors().render(error, "rid")
    assert status == 429 and b'"type":"rate_limit_error"' in body
    assert (b"retry-after", b"7") in headers and (b"anthropic-ratelimit-requests-remaining", b"599") in headers


@pytest.mark.parametrize("headers", [None, {}, {"request-id": "req_1"},
                                     {name.decode(): value.decode() for name, value in openai_headers(SNAPSHOT)}])
def test_json_answer_sends_the_headers_litestar_would(headers: dict[str, str] | None) -> None:
    body = b'{"id": "x"}'
    ours = json_answer(body, headers).to_asgi_response(None, None)  # type: ignore[arg-type]
    plain = Response(body, media_type="application/json", headers=headers).to_asgi_response(None, None)  # type: ignore[arg-type]
    assert sorted(ours.headers.headers) == sorted(plain.headers.headers) and ours.body == plain.body


async def test_the_edge_sends_an_answers_rate_headers_after_its_own_and_before_the_request_id() -> None:
    @post("/r", status_code=200)
    async def handler(request: Request[Any, Any, Any]) -> Response[bytes]:
        call_of(request).rate_headers = openai_headers(SNAPSHOT)
        return json_answer(b"{}", {"request-id": "req_1"})

    app = EdgeMiddleware(Litestar([handler], openapi_config=None, logging_config=None))
    reply = await asgi.request(app, "POST", "/r", headers=[(b"x-request-id", b"abc")])
    assert reply.messages[0]["headers"] == [
        (b"content-type", b"application/json"), (b"content-length", b"2"), (b"request-id", b"req_1"),
        *openai_headers(SNAPSHOT), (b"x-request-id", b"abc")]
