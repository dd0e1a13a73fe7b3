"""Canonical stream chunks -> OpenAI SSE: native relay, usage chunk, error frame, canonical encoding."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from openai.types.chat import ChatCompletionChunk

from adapters.inbound.openai.stream import NATIVE_FORMAT, ChunkWriter
from domain.canonical import (
    Finish,
    MessageStart,
    NativePayload,
    StreamChunk,
    StreamError,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)

dec = msgspec.json.decode
DONE = b"data: [DONE]\n\n"


def native(data: bytes, *events: Any) -> StreamChunk:
    return StreamChunk(events=list(events), native=NativePayload(format="openai-chat", data=data))


USAGE = native(
    b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
    UsageReport(usage=Usage(input_tokens=3, output_tokens=2)),
)
NATIVE = [
    native(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
           MessageStart(id="chatcmpl-9", model="m", created=1)),
    native(b'{"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":{"content":[]}}]}',
           TextDelta(text="hi")),
    native(b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', Finish(reason="end_turn")),
    USAGE,
]  # fmt: skip


def frames(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n\n")
    return [f.removeprefix(b"data: ") for f in data.split(b"\n\n")[:-1]]


# --- the writer ------------------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [False, True])
def test_native_frames_are_relayed_untouched(include_usage: bool) -> None:
    writer = ChunkWriter(include_usage, "m", "rid")
    out = b"".join(writer.feed(chunk) for chunk in NATIVE) + writer.finish()
    expected = [c.native.data for c in NATIVE if c.native and (include_usage or c is not USAGE)]
    assert frames(out) == [*expected, b"[DONE]"]
    assert writer.usage == Usage(input_tokens=3, output_tokens=2)  # recorded even when not sent
    assert writer.finish_reason == "end_turn"
    assert writer.finish() == b""  # [DONE] once


def test_a_chunk_without_events_is_still_relayed() -> None:
    writer = ChunkWriter(False, "m", "rid")
    assert writer.feed(native(b'{"choices":[]}')) == b'data: {"choices":[]}\n\n'


def test_stream_error_ends_the_stream_with_an_error_frame() -> None:
    writer = ChunkWriter(True, "m", "rid")
    writer.feed(NATIVE[0])
    out = writer.feed(native(b'{"error":{}}', StreamError(kind="upstream-error", message="boom", status=502)))
    error, done = frames(out)
    assert dec(error) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": "upstream-error"}
    }
    assert done == b"[DONE]"
    assert writer.error is not None
    assert writer.feed(NATIVE[1]) == b"" and writer.finish() == b""


def test_canonical_events_encode_as_sdk_valid_chunks() -> None:
    writer = ChunkWriter(True, "m", "rid")
    chunks = [
        StreamChunk(events=[MessageStart(id="chatcmpl-1", model="m", created=5)]),
        StreamChunk(events=[ThinkingDelta(text="hmm")]),
        StreamChunk(events=[TextDelta(text="Hel")]),
        StreamChunk(events=[TextDelta(text="lo")]),
        StreamChunk(events=[ToolCallStart(index=0, id="call_1", name="f")]),
        StreamChunk(events=[ToolArgsDelta(index=0, json_fragment='{"a":')]),
        StreamChunk(events=[ToolArgsDelta(index=0, json_fragment="1}")]),
        StreamChunk(
            events=[Finish(reason="tool_use"), UsageReport(usage=Usage(input_tokens=1, output_tokens=9))]
        ),
    ]
    out = b"".join(writer.feed(c) for c in chunks) + writer.finish()
    *payloads, done = frames(out)
    assert done == b"[DONE]"
    parsed = [ChatCompletionChunk.model_validate(dec(p)) for p in payloads]
    assert {(c.id, c.model, c.created) for c in parsed} == {("chatcmpl-1", "m", 5)}
    assert parsed[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
    assert text == "Hello"
    assert dec(payloads[1])["choices"][0]["delta"] == {"reasoning": "hmm"}
    args = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""  # type: ignore[union-attr]
        for c in parsed
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert args == '{"a":1}'
    assert parsed[-2].choices[0].finish_reason == "tool_calls"
    assert parsed[-1].choices == [] and parsed[-1].usage is not None and parsed[-1].usage.total_tokens == 10


def test_canonical_usage_chunk_only_when_asked() -> None:
    writer = ChunkWriter(False, "m", "rid")
    writer.feed(StreamChunk(events=[TextDelta(text="x")]))
    assert writer.feed(StreamChunk(events=[UsageReport(usage=Usage(output_tokens=1))])) == b""
    assert writer.usage == Usage(output_tokens=1)


def test_canonical_stream_without_message_start_still_has_a_role_and_an_id() -> None:
    writer = ChunkWriter(False, "m", "rid")
    payload = frames(writer.feed(StreamChunk(events=[TextDelta(text="x")])))[0]
    chunk = ChatCompletionChunk.model_validate(dec(payload))
    assert chunk.id == "chatcmpl-rid" and chunk.choices[0].delta.role == "assistant"


def test_an_aliased_stream_names_the_clients_model_in_relayed_and_encoded_frames() -> None:
    first = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"upstream-m",' \
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":null}]}'
    relay = ChunkWriter(True, "claude-sonnet-4-6", "rid")
    native = NativePayload(format=NATIVE_FORMAT, data=first)
    out = relay.feed(StreamChunk(events=[MessageStart(id="chatcmpl-1", model="upstream-m", created=5),
                                         TextDelta(text="hi")], native=native))
    doc = dec(frames(out)[0])
    assert doc["model"] == "claude-sonnet-4-6"
    assert doc["choices"][0]["logprobs"] is None  # every other member survives the rename
    encoded = ChunkWriter(True, "claude-sonnet-4-6", "rid")
    out = encoded.feed(StreamChunk(events=[MessageStart(id="chatcmpl-1", model="upstream-m", created=5)]))
    assert dec(frames(out)[0])["model"] == "claude-sonnet-4-6"
