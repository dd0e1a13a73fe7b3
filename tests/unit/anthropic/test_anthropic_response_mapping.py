"""Canonical answers -> Anthropic message JSON, model list, token count and error bodies."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from adapters.inbound.anthropic.answers import (
    encode_message,
    encode_models,
    encode_token_count,
    message_id,
    tool_use_id,
)
from adapters.inbound.anthropic.errors import AnthropicErrors, error_frame, error_type
from domain.canonical import ChatResponse, FinishReason, Part, TextPart, ThinkingPart, ToolUsePart, Usage
from domain.errors import (
    Draining,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotSupported,
    PayloadTooLarge,
    QueueFull,
    QueueTimeout,
    UnsupportedMediaType,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamRejected,
    UpstreamTimeout,
)


def answer(content: list[Part], reason: FinishReason = "end_turn", **kw: Any) -> dict[str, Any]:
    response = ChatResponse(
        id="chatcmpl-abc123",
        model="upstream-name",
        created=1,
        content=content,
        finish_reason=reason,
        usage=Usage(input_tokens=7, output_tokens=9),
        **kw,
    )
    body: dict[str, Any] = msgspec.json.decode(encode_message(response, "reasoning"))
    return body


def test_text_answer() -> None:
    assert answer([TextPart(text="Hello")]) == {
        "type": "message",
        "id": "msg_abc123",
        "role": "assistant",
        "model": "reasoning",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 9},
    }


def test_blocks_are_ordered_thinking_text_tool_use() -> None:
    body = answer(
        [
            ToolUsePart(id="chatcmpl-tool-1", name="f", arguments='{"a": 1}'),
            TextPart(text="Sure."),
            ThinkingPart(text="plan"),
            TextPart(text=""),
        ],
        reason="tool_use",
    )
    assert body["content"] == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "f", "input": {"a": 1}},
    ]
    assert body["stop_reason"] == "tool_use"


def test_tool_calls_turn_a_plain_stop_into_tool_use_and_empty_arguments_into_an_object() -> None:
    body = answer([ToolUsePart(id="call 1/bad", name="f", arguments="")])
    (block,) = body["content"]
    assert block["input"] == {}
    assert block["id"].startswith("toolu_") and len(block["id"]) == 30
    assert body["stop_reason"] == "tool_use"


def test_tool_arguments_that_are_not_an_object_are_an_upstream_fault() -> None:
    with pytest.raises(UpstreamProtocolError):
        answer([ToolUsePart(id="t", name="f", arguments="[1]")])
    with pytest.raises(UpstreamProtocolError):
        answer([ToolUsePart(id="t", name="f", arguments='{"a":')])


def test_a_call_cut_by_max_tokens_is_left_out() -> None:
    """Out of tokens mid-arguments: the answer's max_tokens, without the unfinished call
    (what a stream of the same answer gives); a complete call before the cut stays."""
    cut = [TextPart(text="Sure."), ToolUsePart(id="t1", name="f", arguments="{}"),
           ToolUsePart(id="t2", name="f", arguments='{"city": "Pa')]  # fmt: skip
    body = answer(cut, reason="max_tokens")
    assert body["content"] == [{"type": "text", "text": "Sure."}, {"type": "tool_use", "id": "t1", "name": "f",
                                                                     "input": {}}]  # fmt: skip
    assert body["stop_reason"] == "max_tokens"


@pytest.mark.parametrize(
    ("reason", "stop_sequence", "expected"),
    [
        ("max_tokens", None, ("max_tokens", None)),
        ("stop_sequence", "END", ("stop_sequence", "END")),
        ("end_turn", "END", ("end_turn", None)),
        ("content_filter", None, ("refusal", None)),
    ],
)
def test_stop_reasons(reason: FinishReason, stop_sequence: str | None, expected: tuple[str, Any]) -> None:
    body = answer([TextPart(text="x")], reason=reason, stop_sequence=stop_sequence)
    assert (body["stop_reason"], body["stop_sequence"]) == expected


def test_redacted_thinking_round_trips_its_data() -> None:
    body = answer([ThinkingPart(text="", signature="opaque", redacted=True), TextPart(text="x")])
    assert body["content"][0] == {"type": "redacted_thinking", "data": "opaque"}


def test_ids() -> None:
    assert message_id("chatcmpl-9f3") == "msg_9f3"
    assert message_id("").startswith("msg_") and len(message_id("")) == 36
    assert message_id("chatcmpl-a/b").startswith("msg_") and "/" not in message_id("chatcmpl-a/b")
    assert tool_use_id("call_abc") == "call_abc"
    assert tool_use_id("").startswith("toolu_")
    assert tool_use_id("x" * 65).startswith("toolu_")


def test_model_list_and_token_count() -> None:
    assert msgspec.json.decode(encode_models(["a", "b"], "2026-01-01T00:00:00Z")) == {
        "data": [
            {"type": "model", "id": "a", "display_name": "a", "created_at": "2026-01-01T00:00:00Z"},
            {"type": "model", "id": "b", "display_name": "b", "created_at": "2026-01-01T00:00:00Z"},
        ],
        "has_more": False,
        "first_id": "a",
        "last_id": "b",
    }
    assert msgspec.json.decode(encode_models([], "t")) == {
        "data": [],
        "has_more": False,
        "first_id": None,
        "last_id": None,
    }
    assert encode_token_count(12) == b'{"input_tokens":12}'


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (ModelNotFound("x"), 404, "not_found_error"),
        (MethodNotAllowed(), 405, "invalid_request_error"),
        (PayloadTooLarge(), 413, "request_too_large"),
        (UnsupportedMediaType(), 415, "invalid_request_error"),
        (UpstreamRejected(422, "nope"), 422, "invalid_request_error"),
        (UpstreamRejected(401, "key"), 401, "authentication_error"),
        (GatewayError(), 500, "api_error"),
        (NotSupported(), 501, "api_error"),
        (UpstreamError(), 502, "api_error"),
        (QueueFull(retry_after=2), 503, "overloaded_error"),
        (QueueTimeout(retry_after=1), 503, "overloaded_error"),
        (Draining(retry_after=5), 503, "overloaded_error"),
        (UpstreamTimeout(), 504, "timeout_error"),
    ],
)
def test_error_rendering(error: GatewayError, status: int, kind: str) -> None:
    code, body, content_type, headers = AnthropicErrors().render(error, "req_1")
    assert (code, content_type) == (status, b"application/json")
    assert msgspec.json.decode(body) == {
        "type": "error",
        "error": {"type": kind, "message": error.message},
        "request_id": "req_1",
    }
    assert (b"request-id", b"req_1") in headers
    retry = [v for k, v in headers if k == b"retry-after"]
    assert retry == ([str(error.retry_after).encode()] if error.retry_after else [])


def test_error_types_for_unlisted_statuses() -> None:
    assert [error_type(s) for s in (403, 418, 429, 529, 599)] == [
        "permission_error",
        "invalid_request_error",
        "rate_limit_error",
        "overloaded_error",
        "api_error",
    ]


def test_stream_error_frame() -> None:
    frame = AnthropicErrors().stream_error(QueueTimeout(retry_after=3, message="Timed out"), "r")
    assert frame == error_frame(503, "Timed out")
    assert frame == (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Timed out"}}\n\n'
    )
