"""The Responses Router on Litestar, driven over ASGI, with a scripted fake of the chat service.

Covers what only the controller decides: when the 200 starts (a refusal or an early
upstream failure keeps its status), the queued events, keep-alives while nothing moves,
failures after the start, and that a hang-up closes the service stream (the slot goes back).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgspec
from litestar import Litestar
from tests.support import asgi
from tests.support.responses_grammar import check_responses_stream
from tests.unit.anthropic.asgi_fakes import ANSWER, FakeService, Observer, chunk

from adapters.inbound._shared.dialect import EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound.responses import router
from domain.canonical import QueuePosition, StreamError
from domain.errors import QueueFull, QueueTimeout

PATH = "/v1/responses"
BODY = {"model": "reasoning", "input": "hi"}
STREAM = {**BODY, "stream": True}
PING = 0.05


async def call(service: FakeService, body: Any, hang_up_after: float | None = None,
               method: str = "POST", path: str = PATH) -> tuple[asgi.Exchange, Observer]:
    observer = Observer()
    context = EdgeContext(service=cast(Any, service), observer=observer, max_body_bytes=10_000,
                          ping_interval_seconds=PING)
    app = EdgeMiddleware(Litestar(route_handlers=[router(context)], openapi_config=None, logging_config=None))
    exchange = asgi.Exchange()
    if hang_up_after is not None:
        asyncio.get_running_loop().call_later(hang_up_after, exchange.hang_up.set)
    raw = msgspec.json.encode(body) if body is not None else b""
    await asyncio.wait_for(asgi.request(app, method, path, raw, [(b"x-request-id", b"req-42")], exchange), 5)
    return exchange, observer


async def test_plain_response() -> None:
    service = FakeService()
    result, observer = await call(service, BODY)
    assert result.status == 200 and result.headers[b"content-type"] == b"application/json"
    body = result.json()
    assert body["id"] == "resp_req-42" and body["model"] == "reasoning" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "hello"
    assert body["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                             "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 4}
    assert service.requests[0].surface == "responses" and not service.requests[0].stream
    record = observer.records[0]
    assert (record.surface, record.route, record.output_tokens, record.finish_reason) == (
        "responses", "/v1/responses", 1, "end_turn")


async def test_stream_admitted_at_once() -> None:
    service = FakeService(ANSWER)
    result, observer = await call(service, STREAM)
    assert result.status == 200 and result.headers[b"content-type"].startswith(b"text/event-stream")
    assert result.chunks[0].startswith(b"event: response.created\n")
    assert len(result.chunks) == 4  # one send per upstream read (the first with created/in_progress), the end
    events = check_responses_stream(result.body)
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "alpha"
    assert service.closed.is_set()
    record = observer.records[0]
    assert (record.input_tokens, record.output_tokens, record.finish_reason) == (2, 1, "end_turn")
    assert record.first_token_seconds is not None


async def test_queued_stream_says_queued_once_then_keeps_alive() -> None:
    script = [QueuePosition(position=2, queued=2), 0.12, QueuePosition(position=1, queued=1), *ANSWER]
    result, _ = await call(FakeService(script), STREAM)
    assert result.status == 200
    assert result.chunks[0].startswith(b"event: response.created\n") and b"event: response.queued\n" in result.chunks[0]
    assert b": keep-alive\n\n" in result.chunks[1:3]
    events = check_responses_stream(result.body)
    names = [e["type"] for e in events]
    assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert names.count("response.queued") == 1 and b"position" not in result.body  # positions stay on /llm


async def test_no_keep_alive_before_the_response_started() -> None:
    result, _ = await call(FakeService([0.15, *ANSWER]), STREAM)
    assert result.chunks[0].startswith(b"event: response.created\n")


async def test_a_refusal_before_anything_is_a_problem_document() -> None:
    result, _ = await call(FakeService([QueueFull(retry_after=2)]), STREAM)
    assert result.status == 503 and result.headers[b"retry-after"] == b"2"
    assert result.headers[b"content-type"] == b"application/problem+json"
    assert result.json()["error"] == {"message": "Upstream queue is full", "type": "server_error", "param": None,
                                      "code": "queue-full"}


async def test_an_upstream_failure_as_first_chunk_keeps_its_status() -> None:
    failure = StreamError(kind="upstream-error", message="upstream 500", status=502)
    result, observer = await call(FakeService([chunk(failure)]), STREAM)
    assert result.status == 502 and result.json()["detail"] == "upstream 500"
    assert observer.records[0].error_kind == "upstream-error"


async def test_a_failure_after_queued_is_error_then_failed() -> None:
    script = [QueuePosition(position=1, queued=1), QueueTimeout(retry_after=1, message="Queue wait timed out")]
    result, observer = await call(FakeService(script), STREAM)
    assert result.status == 200
    events = check_responses_stream(result.body)
    assert [e["type"] for e in events] == ["response.created", "response.queued", "error", "response.failed"]
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "Queue wait timed out"}
    assert observer.records[0].error_kind == "queue-timeout"


async def test_a_failure_mid_stream_keeps_what_was_sent() -> None:
    script = [*ANSWER[:2], chunk(StreamError(kind="upstream-error", message="reset", status=502)), *ANSWER[2:]]
    result, observer = await call(FakeService(script), STREAM)
    events = check_responses_stream(result.body)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert any(e["type"] == "response.output_text.delta" and e["delta"] == "alpha" for e in events)
    assert observer.records[0].error_kind == "upstream-error"


async def test_a_hang_up_mid_stream_closes_the_service_stream() -> None:
    service = FakeService([*ANSWER[:2], 5.0, *ANSWER[2:]])
    result, observer = await call(service, STREAM, hang_up_after=0.2)
    await asyncio.wait_for(service.closed.wait(), 2)
    assert observer.records[0].client_gone and b"alpha" in result.body


async def test_a_bad_request_names_the_field() -> None:
    result, _ = await call(FakeService(), {"model": "reasoning", "input": [{"role": "user", "content": 5}]})
    assert result.status == 400 and result.headers[b"content-type"] == b"application/problem+json"
    assert result.json()["error"]["param"] == "input[0].content"


async def test_other_methods_are_405_and_other_paths_are_left_to_the_v1_router() -> None:
    result, _ = await call(FakeService(), None, method="GET")
    assert result.status == 405 and result.headers[b"content-type"] == b"application/problem+json"
    result, _ = await call(FakeService(), BODY, path="/v1/responses/resp_1")
    assert result.status == 404  # no catch-all of its own: the Chat Completions Router owns /v1's
