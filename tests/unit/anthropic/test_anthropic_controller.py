"""The `/llm` Router on Litestar, driven over ASGI, with a scripted fake of the chat service.

Covers what only the controller decides: when the 200 starts, queue frames and
keep-alives, pings while tokens are slow, errors before and after the 200, and that
a hang-up closes the service stream (so the slot goes back).
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.anthropic_grammar import check_anthropic_stream
from tests.unit.anthropic.asgi_fakes import ANSWER, BODY, FakeService, call, chunk, frames

from domain.canonical import (
    Finish,
    QueuePosition,
    StreamError,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)
from domain.consumers import ANONYMOUS
from domain.errors import NotSupported, QueueFull, QueueTimeout, UpstreamError


async def test_non_streaming_message() -> None:
    service = FakeService()
    result, observer = await call(service, "/llm/v1/messages", BODY)
    assert result.status == 200
    assert service.consumers == [ANONYMOUS]  # auth off: every request is the anonymous consumer
    assert result.headers[b"content-type"] == b"application/json"
    assert result.headers[b"request-id"] == b"req-42"
    body = result.json()
    assert body["id"] == "msg_9" and body["content"] == [{"type": "text", "text": "hello"}]
    assert body["model"] == "reasoning"
    record = observer.records[0]
    assert (record.model, record.upstream, record.status, record.output_tokens) == ("reasoning", "up", 200, 1)


async def test_stream_admitted_at_once_starts_with_message_start_and_flushes_each_chunk() -> None:
    service = FakeService(ANSWER)
    result, observer = await call(service, "/llm/v1/messages", {**BODY, "stream": True})
    assert result.status == 200
    assert result.headers[b"content-type"].startswith(b"text/event-stream")
    assert result.headers[b"request-id"] == b"req-42"
    assert result.chunks[0].startswith(b"event: message_start\n")
    assert len(result.chunks) == 4  # one send per upstream chunk, then the end
    check_anthropic_stream(result.body)
    assert service.requests[0].stream and service.closed.is_set()
    record = observer.records[0]
    assert (record.finish_reason, record.input_tokens, record.output_tokens) == ("end_turn", 2, 1)
    assert record.stream and record.first_token_seconds is not None and record.queue_wait_seconds is None


async def test_chunks_of_one_upstream_read_go_out_in_one_send() -> None:
    first, second, last = ANSWER
    script = [[first, second, last]]  # one upstream read
    result, _ = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    assert result.status == 200
    assert len(result.chunks) == 2  # the read's frames in one send, then the end
    assert result.chunks[0].startswith(b"event: message_start\n")
    assert b"content_block_delta" in result.chunks[0]
    check_anthropic_stream(result.body)


async def test_a_reads_frames_go_out_before_a_failure_that_follows_it() -> None:
    first, second, _ = ANSWER
    script = [[first, second], UpstreamError("connection reset")]
    result, _ = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    assert result.status == 200
    body = result.body
    assert body.index(b"event: message_start") < body.index(b"content_block_delta") < body.index(b"event: error")


async def test_queued_stream_sends_queue_frames_then_keep_alives_then_the_message() -> None:
    script = [
        QueuePosition(position=2, queued=2),
        0.12,
        QueuePosition(position=1, queued=1),
        0.01,
        *ANSWER[:2],
        0.12,
        *ANSWER[2:],
    ]
    result, observer = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    got = frames(result)
    assert got[0] == b'event: queue\ndata: {"type":"queue","position":2,"queued":2}\n\n'
    assert b": keep-alive\n\n" in got[1:3]
    start = got.index(next(f for f in got if f.startswith(b"event: message_start")))
    assert b'event: queue\ndata: {"type":"queue","position":1,"queued":1}\n\n' in got[:start]
    assert all(not f.startswith(b":") for f in got[start:])  # pings, not comments, in the message
    assert any(f.startswith(b"event: ping\n") for f in got[start:])
    assert not any(f.startswith(b"event: queue") for f in got[start:])
    check_anthropic_stream(result.body, allow_queue=True)
    # The service notes the queue wait when the slot is granted; the dialect does not overwrite
    # it when the first token arrives (that added the upstream's time to first token).
    assert observer.records[0].queue_wait_seconds is None


async def test_pings_while_a_tool_call_is_collected() -> None:
    """The upstream streams a call's arguments faster than the heartbeat, and nothing goes out
    until the call is complete: pings keep the connection alive meanwhile."""
    start, *_ = ANSWER
    fragments: list[Any] = []
    for piece in ['{"city"', ": ", '"Par', 'is"', "}"]:
        fragments += [0.03, chunk(ToolArgsDelta(index=0, json_fragment=piece))]  # 0.03 s < PING_INTERVAL
    script = [start, chunk(ToolCallStart(index=0, id="call_1", name="f")), *fragments,
              chunk(Finish(reason="tool_use"), UsageReport(usage=Usage(input_tokens=2, output_tokens=5)))]  # fmt: skip
    result, _ = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    body = result.body
    assert body.index(b"event: message_start") < body.index(b"event: ping") < body.index(b"content_block_start")
    events = check_anthropic_stream(body)  # without the pings
    names = [e.name for e in events]
    (delta,) = [e.data["delta"] for e in events if e.name == "content_block_delta"]
    assert delta == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert names[-2:] == ["message_delta", "message_stop"]


async def test_no_pings_before_the_response_started() -> None:
    result, _ = await call(FakeService([0.15, *ANSWER]), "/llm/v1/messages", {**BODY, "stream": True})
    assert result.chunks[0].startswith(b"event: message_start\n")


async def test_refusal_before_anything_is_a_proper_http_error() -> None:
    result, _ = await call(
        FakeService([QueueFull(retry_after=2)]), "/llm/v1/messages", {**BODY, "stream": True}
    )
    assert result.status == 503
    assert result.headers[b"retry-after"] == b"2" and result.headers[b"request-id"] == b"req-42"
    assert result.json()["error"]["type"] == "overloaded_error"


async def test_upstream_error_as_first_chunk_is_a_proper_http_error() -> None:
    failure = StreamError(kind="upstream-error", message="upstream 500", status=502)
    result, observer = await call(FakeService([chunk(failure)]), "/llm/v1/messages", {**BODY, "stream": True})
    assert result.status == 502
    assert result.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream 500"},
        "request_id": "req-42",
    }
    assert observer.records[0].error_kind == "upstream-error"


async def test_failure_after_queue_frames_is_an_in_stream_error() -> None:
    script = [
        QueuePosition(position=1, queued=1),
        QueueTimeout(retry_after=1, message="Queue wait timed out"),
    ]
    result, _ = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    assert result.status == 200
    events = check_anthropic_stream(result.body, allow_queue=True)
    assert [e.name for e in events] == ["error"]
    assert events[0].data["error"] == {"type": "overloaded_error", "message": "Queue wait timed out"}


async def test_failure_mid_stream_is_an_error_frame_without_message_stop() -> None:
    script = [
        *ANSWER[:2],
        chunk(StreamError(kind="upstream-error", message="reset", status=502)),
        *ANSWER[2:],
    ]
    result, _ = await call(FakeService(script), "/llm/v1/messages", {**BODY, "stream": True})
    events = check_anthropic_stream(result.body)
    assert events[-1].name == "error"


async def test_hang_up_while_queued_closes_the_service_stream() -> None:
    service = FakeService([QueuePosition(position=1, queued=1), 10.0, *ANSWER])
    result, observer = await call(service, "/llm/v1/messages", {**BODY, "stream": True}, hang_up_after=0.1)
    assert service.closed.is_set()
    assert observer.records[0].client_gone
    assert b"message_start" not in result.body


async def test_hang_up_while_waiting_for_the_upstream_closes_the_service_stream() -> None:
    service = FakeService([10.0, *ANSWER])
    result, observer = await call(service, "/llm/v1/messages", {**BODY, "stream": True}, hang_up_after=0.1)
    assert service.closed.is_set() and result.status == 0
    assert observer.records[0].status == 499


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (
            {"model": "reasoning", "messages": [{"role": "user", "content": "x"}]},
            400,
            "invalid_request_error",
        ),
        ({**BODY, "model": "nope"}, 404, "not_found_error"),
        (b"{", 400, "invalid_request_error"),
        ({**BODY, "messages": [{"role": "user", "content": "x" * 20_000}]}, 413, "request_too_large"),
    ],
)
async def test_request_errors(body: Any, status: int, kind: str) -> None:
    result, _ = await call(FakeService(), "/llm/v1/messages", body)
    assert (result.status, result.json()["error"]["type"]) == (status, kind)
    assert result.json()["request_id"] == "req-42"


async def test_wrong_method() -> None:
    result, _ = await call(FakeService(), "/llm/v1/messages", method="GET")
    assert (result.status, result.json()["error"]["type"]) == (405, "invalid_request_error")


async def test_models() -> None:
    result, _ = await call(FakeService(), "/llm/v1/models", method="GET")
    body = result.json()
    assert [m["id"] for m in body["data"]] == ["reasoning", "qwen"]
    assert (body["first_id"], body["last_id"], body["has_more"]) == ("reasoning", "qwen", False)
    assert result.headers[b"request-id"] == b"req-42"


async def test_count_tokens() -> None:
    body = {"model": "reasoning", "messages": [{"role": "user", "content": "hi there"}]}
    result, _ = await call(FakeService(), "/llm/v1/messages/count_tokens", body)
    assert (result.status, result.json()) == (200, {"input_tokens": 5})
    service = FakeService()
    service.count = NotSupported()
    result, _ = await call(service, "/llm/v1/messages/count_tokens", body)
    assert result.status == 501
    assert "Token counting is not available for model 'reasoning'" in result.json()["error"]["message"]
