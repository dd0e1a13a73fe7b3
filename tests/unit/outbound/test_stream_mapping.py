"""Recorded vLLM stream transcripts -> the exact canonical event sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.outbound.openai_compat.finish_reasons import map_finish
from adapters.outbound.openai_compat.sse_decoder import SseDecoder
from adapters.outbound.openai_compat.stream_mapping import Phase, StreamMapper
from domain.canonical import (
    Finish,
    MessageStart,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)
from domain.errors import UpstreamTimeout

FIXTURES = Path(__file__).parent / "fixtures"
T = 1764440000
QWEN = "qwen2.5:3b-instruct"
NO_FINISH = StreamError(
    kind="upstream-protocol-error", message="upstream stream ended without a finish_reason", status=502
)


def usage(prompt: int, completion: int) -> UsageReport:
    return UsageReport(usage=Usage(input_tokens=prompt, output_tokens=completion))


def run(raw: bytes, step: int | None = None) -> tuple[list[StreamChunk], StreamMapper]:
    """Decode and map a transcript the way the client does, `step` bytes per read."""
    decoder, mapper = SseDecoder(), StreamMapper()
    chunks: list[StreamChunk] = []
    reads = [raw] if step is None else [raw[i : i + step] for i in range(0, len(raw), step)]
    for data in reads:
        for payload in decoder.feed(data):
            chunk = mapper.feed(payload)
            if chunk is not None:
                chunks.append(chunk)
    tail = mapper.close()
    if tail is not None:
        chunks.append(tail)
    return chunks, mapper


TRANSCRIPTS: dict[str, list[StreamEvent]] = {
    "plain_text_usage": [
        MessageStart(id="chatcmpl-7d1e5b0c2a9f4f0b8e3c6a1d9b2f4e70", model=QWEN, created=T),
        TextDelta(text="Hello"),
        TextDelta(text=" there"),
        TextDelta(text="!"),
        Finish(reason="end_turn"),
        usage(21, 4),
    ],
    "reasoning_then_text": [
        MessageStart(id="chatcmpl-0a4c9e2f7b1d4c3a9e8f6d5b4a3c2e1f", model="reasoning", created=T),
        ThinkingDelta(text="Okay, the user"),
        ThinkingDelta(text=" wants 2+2."),
        TextDelta(text="\n\n"),
        TextDelta(text="2 + 2 = 4"),
        Finish(reason="end_turn"),
        usage(15, 22),
    ],
    "reasoning_content_legacy": [
        MessageStart(id="chatcmpl-5e6f7a8b9c0d4e1f8a2b3c4d5e6f7a8b", model="reasoning", created=T),
        ThinkingDelta(text="Let me think"),
        ThinkingDelta(text=" briefly."),
        TextDelta(text="Done."),
        Finish(reason="end_turn"),
        usage(9, 7),
    ],
    "tool_calls_parallel": [
        MessageStart(id="chatcmpl-9b8a7c6d5e4f4a3b9c2d1e0f9a8b7c6d", model=QWEN, created=T),
        ToolCallStart(index=0, id="chatcmpl-tool-2f6e1c9a8b7d4e5f", name="get_weather"),
        ToolArgsDelta(index=0, json_fragment='{"city": "'),
        ToolArgsDelta(index=0, json_fragment="Paris"),
        ToolArgsDelta(index=0, json_fragment='"}'),
        ToolCallStart(index=1, id="chatcmpl-tool-8d3a2b1c0e9f4a7b", name="get_time"),
        ToolArgsDelta(index=1, json_fragment='{"tz": "Europe/'),
        ToolArgsDelta(index=1, json_fragment='Paris"}'),
        Finish(reason="tool_use"),
        usage(180, 41),
    ],
    "length_stop": [
        MessageStart(id="chatcmpl-1c2d3e4f5a6b4c7d8e9f0a1b2c3d4e5f", model=QWEN, created=T),
        TextDelta(text="Once upon"),
        TextDelta(text=" a time"),
        Finish(reason="max_tokens"),
        usage(12, 4),
    ],
    "stop_string": [
        MessageStart(id="chatcmpl-6a5b4c3d2e1f4a0b9c8d7e6f5a4b3c2d", model=QWEN, created=T),
        TextDelta(text="1, 2, 3"),
        Finish(reason="stop_sequence", stop_sequence="\n\nUser:"),
        usage(30, 6),
    ],
    "midstream_error": [
        MessageStart(id="chatcmpl-3e2d1c0b9a8f4e7d6c5b4a3f2e1d0c9b", model=QWEN, created=T),
        TextDelta(text="Partial"),
        StreamError(
            kind="upstream-error",
            message="EngineCore encountered an issue. See stack trace (above) for the root cause.",
            status=500,
        ),
    ],
    "no_finish_eof": [
        MessageStart(id="chatcmpl-8f7e6d5c4b3a4f2e1d0c9b8a7f6e5d4c", model=QWEN, created=T),
        TextDelta(text="The answer is"),
        NO_FINISH,
    ],
}


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
@pytest.mark.parametrize("step", [None, 1, 7, 64])
def test_transcript(name: str, step: int | None) -> None:
    raw = (FIXTURES / f"{name}.sse").read_bytes()
    chunks, _ = run(raw, step)
    assert [event for chunk in chunks for event in chunk.events] == TRANSCRIPTS[name]


def test_native_payloads_are_the_upstream_frames() -> None:
    raw = (FIXTURES / "plain_text_usage.sse").read_bytes()
    chunks, mapper = run(raw)
    frames = [p for p in SseDecoder().feed(raw) if p != b"[DONE]"]
    assert [c.native.data for c in chunks if c.native] == frames
    assert all(c.native is not None and c.native.format == "openai-chat" for c in chunks)
    assert mapper.phase is Phase.DONE


def test_upstream_error_payload_is_relayed_natively() -> None:
    chunks, mapper = run((FIXTURES / "midstream_error.sse").read_bytes())
    assert chunks[-1].native is not None and b'"error"' in chunks[-1].native.data
    assert mapper.phase is Phase.FAILED  # the [DONE] after the error changes nothing


def test_done_without_finish_is_an_error() -> None:
    raw = (FIXTURES / "no_finish_eof.sse").read_bytes() + b"data: [DONE]\n\n"
    chunks, _ = run(raw)
    assert chunks[-1] == StreamChunk(events=[NO_FINISH])


def test_flat_error_envelope() -> None:
    mapper = StreamMapper()
    chunk = mapper.feed(b'{"object":"error","message":"too long","type":"BadRequestError","code":400}')
    assert chunk is not None
    assert chunk.events == [StreamError(kind="upstream-rejected", message="too long", status=400)]
    assert mapper.feed(b'{"id":"x","choices":[]}') is None


def test_malformed_payload_is_an_error_without_native() -> None:
    mapper = StreamMapper()
    chunk = mapper.feed(b'{"id": "x", "choices": [')
    assert chunk is not None and chunk.native is None
    [event] = chunk.events
    assert isinstance(event, StreamError)
    assert (event.kind, event.status) == ("upstream-protocol-error", 502)
    assert mapper.close() is None


def test_reasoning_wins_over_deprecated_alias() -> None:
    mapper = StreamMapper()
    chunk = mapper.feed(
        b'{"id":"x","choices":[{"index":0,"delta":{"reasoning":"a","reasoning_content":"a"}}]}'
    )
    assert chunk is not None and chunk.events[1:] == [ThinkingDelta(text="a")]


def test_only_choice_zero_makes_events() -> None:
    mapper = StreamMapper()
    chunk = mapper.feed(
        b'{"id":"x","model":"m","created":1,"choices":['
        b'{"index":1,"delta":{"content":"other"},"finish_reason":"length"},'
        b'{"index":0,"delta":{"content":"mine"}}]}'
    )
    assert chunk is not None
    assert chunk.events == [MessageStart(id="x", model="m", created=1), TextDelta(text="mine")]
    assert mapper.phase is Phase.OPEN


def test_tool_call_without_name_first_is_held_until_named() -> None:
    mapper = StreamMapper()
    mapper.feed(
        b'{"id":"m1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}'
    )
    chunk = mapper.feed(
        b'{"id":"m1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"}"}}]}}]}'
    )
    assert chunk is not None
    assert chunk.events == [
        ToolCallStart(index=0, id="m1-tool-0", name="f"),
        ToolArgsDelta(index=0, json_fragment="{"),
        ToolArgsDelta(index=0, json_fragment="}"),
    ]


def test_abort_finish_is_an_error_and_usage_comes_before_it() -> None:
    mapper = StreamMapper()
    chunk = mapper.feed(
        b'{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"abort"}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    )
    assert chunk is not None
    assert chunk.events[1] == usage(3, 1)
    assert isinstance(chunk.events[2], StreamError) and chunk.events[2].status == 502
    assert mapper.phase is Phase.FAILED


def test_transport_failure_after_finish_is_ignored() -> None:
    raw = (FIXTURES / "length_stop.sse").read_bytes().replace(b"data: [DONE]\n\n", b"")
    _, mapper = run(raw)
    assert mapper.phase is Phase.FINISHED
    assert mapper.fail(UpstreamTimeout("late")) is None
    fresh = StreamMapper()
    fresh.feed(b'{"id":"x","choices":[]}')
    tail = fresh.fail(UpstreamTimeout("stalled"))
    assert tail == StreamChunk(events=[StreamError(kind="upstream-timeout", message="stalled", status=504)])


@pytest.mark.parametrize(
    ("finish", "stop_reason", "tools", "expected"),
    [
        ("stop", None, False, Finish(reason="end_turn")),
        ("stop", 151645, False, Finish(reason="end_turn")),  # a stop token id, not a string
        ("stop", "###", False, Finish(reason="stop_sequence", stop_sequence="###")),
        ("stop", None, True, Finish(reason="tool_use")),
        ("tool_calls", None, True, Finish(reason="tool_use")),
        ("length", None, True, Finish(reason="max_tokens")),
        ("content_filter", None, False, Finish(reason="content_filter")),
        ("repetition", None, False, Finish(reason="end_turn")),
    ],
)
def test_map_finish(finish: str, stop_reason: str | int | None, tools: bool, expected: Finish) -> None:
    assert map_finish(finish, stop_reason, tools) == expected


_FIRST = b'{"id":"c1","model":"m","created":5,"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'


@pytest.mark.parametrize(
    ("payload", "events"),
    [
        (b'{"object":"error","message":"too long","type":"BadRequestError","code":400}',
         [StreamError(kind="upstream-rejected", message="too long", status=400)]),
        (b'{"error":{"message":"boom","type":"InternalServerError","code":500}}',
         [StreamError(kind="upstream-error", message="boom", status=500)]),
        (b'{"error":"bare"}',
         [StreamError(kind="upstream-error", message="upstream reported an error mid-stream", status=502)]),
        (b"[DONE]", [NO_FINISH]),
        (b'{"choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"a"}}]}',
         [TextDelta(text="a")]),
        (b'{"choices":[{"index":0,"delta":{"content":"a","reasoning":"r"}}]}',
         [ThinkingDelta(text="r"), TextDelta(text="a")]),
        (b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}],'
         b'"usage":{"prompt_tokens":2,"completion_tokens":3}}',
         [TextDelta(text="a"), Finish(reason="end_turn"), usage(2, 3)]),
        (b'{"choices":[{"index":0,"delta":{},"finish_reason":"abort"}],"usage":{"prompt_tokens":2,"completion_tokens":3}}',
         [usage(2, 3), StreamError(kind="upstream-error",
                                   message="upstream ended the generation with finish_reason 'abort'", status=502)]),
        (b'{"choices":[]}', []),
    ],
)
def test_payloads_after_the_first_map_as_the_first_would(payload: bytes, events: list[object]) -> None:
    """After the first payload a narrower view is decoded: errors, [DONE], other choices,
    reasoning, a finish with usage map the same as they do in the first payload."""
    mapper = StreamMapper()
    assert mapper.feed(_FIRST) is not None and mapper.phase is Phase.OPEN
    chunk = mapper.feed(payload)
    assert chunk is not None and chunk.events == events


def test_a_malformed_payload_after_the_first_is_an_error_without_native() -> None:
    mapper = StreamMapper()
    mapper.feed(_FIRST)
    chunk = mapper.feed(b'{"choices": [')
    assert chunk is not None and chunk.native is None and mapper.phase is Phase.FAILED


_HEAD = b'{"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":'
_TAIL = b'},"logprobs":null,"finish_reason":null}]}'
_TEXTS = [b'"plain"', b'""', b'"\\"quoted\\" \\\\"', b'"caf\xc3\xa9 \\u00e9\\n\\t"', b'"\\ud83d\\ude00"',
          b'"ends in \\\\"', b' "spaced" ', b'"a" "b"', b'"unterminated', b'"raw \x01 control"', b'"bad \\x escape"',
          b'"\xff"', b"1", b"null", b'"a"},"x":{"content":"b"', b"", b'"', b'"\\u12"']


def _shaped_payloads() -> list[bytes]:
    """Token payloads of one shape (the learnt fast path's), valid and not, and others of a stream."""
    payloads = [_HEAD + text + _TAIL for text in _TEXTS]
    payloads += [
        _HEAD.replace(b'"index":0', b'"index":1') + b'"other choice"' + _TAIL,  # n > 1
        _HEAD + b'"x"' + _TAIL.replace(b"}]}", b'}],"usage":{"prompt_tokens":1,"completion_tokens":2}}'),
        _HEAD.replace(b'"created":5', b'"created":6') + b'"moved"' + _TAIL,
        _HEAD + b'"x","reasoning":"r"' + _TAIL,
        _HEAD + b'"x"' + _TAIL[:-1],  # malformed: the last brace missing
        _HEAD + b'"x"' + _TAIL + b"]",
        _HEAD + b'"after"' + _TAIL,
    ]
    return payloads


@pytest.mark.parametrize("payload", _shaped_payloads())
def test_a_learnt_token_shape_maps_every_payload_as_the_full_decode(payload: bytes) -> None:
    """The token path that decodes only the text between the learnt bytes maps any payload,
    valid or not, exactly as a mapper that never learns (always the full decode)."""
    learnt, reference = StreamMapper(), StreamMapper()
    reference._tries = 0
    for mapper in (learnt, reference):
        mapper.feed(_FIRST)
        mapper.feed(_HEAD + b'"learn"' + _TAIL)
    assert learnt._head == _HEAD and reference._head is None
    finish = b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    for following in (payload, _HEAD + b'"next"' + _TAIL, finish):
        got, want = learnt.feed(following), reference.feed(following)
        assert got == want
        assert learnt.phase is reference.phase


@pytest.mark.parametrize(
    "payload",
    [
        # the last "content" key is not choice 0's text
        _HEAD + b'"t"},"logprobs":{"content":[{"token":"t","logprob":-0.1}]},"finish_reason":null}]}',
        _HEAD + b'"t"},"extra":{"content":"t"},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{"content":"t"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}',
        b'{"choices":[{"index":0,"delta":{"content":"t"}},{"index":0,"delta":{"content":"t"}}]}',
        b'{"choices":[{"index":0,"delta":{"content" : "t"}}]}',
    ],
)
def test_no_shape_is_learnt_where_the_text_is_not_choice_zeros_alone(payload: bytes) -> None:
    mapper = StreamMapper()
    mapper.feed(_FIRST)
    chunk = mapper.feed(payload)
    assert chunk is not None and chunk.events[0] == TextDelta(text="t")
    assert mapper._head is None


def test_a_shape_is_learnt_from_a_few_payloads_at_most() -> None:
    mapper = StreamMapper()
    mapper.feed(_FIRST)
    for _ in range(5):
        mapper.feed(b'{"choices":[{"index":0,"delta":{"content":"t"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}')
    assert mapper._tries == 0
    mapper.feed(_HEAD + b'"x"' + _TAIL)
    assert mapper._head is None
