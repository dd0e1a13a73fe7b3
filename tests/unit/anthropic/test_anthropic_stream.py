"""The Anthropic stream state machine: transitions, edge cases and the grammar property."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.anthropic_grammar import Event, GrammarError, check_anthropic_stream

from adapters.inbound.anthropic.frames import queue_frame
from adapters.inbound.anthropic.stream import NO_FINISH, AnthropicStream, Phase
from adapters.inbound.anthropic.tool_arguments import tool_input
from domain.canonical import (
    Finish,
    FinishReason,
    MessageStart,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)
from domain.errors import UpstreamProtocolError

START = MessageStart(id="chatcmpl-1", model="m", created=0)


def run(events: list[StreamEvent]) -> tuple[AnthropicStream, list[Event]]:
    machine = AnthropicStream("model")
    frames = machine.feed_many(events) + machine.finish()
    return machine, check_anthropic_stream(frames)


def names(events: list[Event]) -> list[str]:
    out = []
    for event in events:
        delta = event.data.get("delta", {})
        block = event.data.get("content_block", {})
        out.append(f"{event.name}:{block.get('type') or delta.get('type') or ''}".rstrip(":"))
    return out


def test_phases_follow_the_answer() -> None:
    machine = AnthropicStream("m")
    steps: list[StreamEvent] = [
        START, ThinkingDelta(text="t"), TextDelta(text="x"), ToolCallStart(index=0, id="c", name="f"),
        Finish(reason="tool_use"),
    ]  # fmt: skip
    phases = [machine.phase]
    for event in steps:
        machine.feed(event)
        phases.append(machine.phase)
    assert machine.in_message and machine.blocks == 3
    machine.finish()
    phases.append(machine.phase)
    assert phases == [
        Phase.IDLE, Phase.MESSAGE_OPEN, Phase.THINKING, Phase.TEXT, Phase.TOOL_USE, Phase.FINISHED,
        Phase.DONE,
    ]  # fmt: skip
    assert machine.closed and not machine.in_message


def test_finish_is_idempotent_and_nothing_follows_the_end() -> None:
    machine = AnthropicStream("m")
    machine.feed_many([START, TextDelta(text="a"), Finish(reason="end_turn")])
    assert machine.finish()
    assert machine.finish() == []
    assert machine.feed(TextDelta(text="late")) == []
    assert machine.feed(StreamError(kind="k", message="m", status=500)) == []


def test_content_without_message_start_opens_the_message_itself() -> None:
    _, events = run([TextDelta(text="hi"), Finish(reason="end_turn")])
    assert events[0].name == "message_start"
    assert events[0].data["message"]["id"].startswith("msg_")


def test_empty_fragments_open_no_block() -> None:
    _, events = run([START, TextDelta(text=""), ThinkingDelta(text=""), Finish(reason="end_turn")])
    assert names(events) == ["message_start", "message_delta", "message_stop"]


def test_usage_is_cumulative_and_reported_in_message_delta() -> None:
    machine, events = run(
        [
            UsageReport(usage=Usage(input_tokens=3, output_tokens=0)),
            START,
            TextDelta(text="x"),
            UsageReport(usage=Usage(input_tokens=3, output_tokens=1)),
            Finish(reason="end_turn"),
            UsageReport(usage=Usage(input_tokens=3, output_tokens=4)),
        ]
    )
    assert events[0].data["message"]["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert events[-2].data["usage"] == {"input_tokens": 3, "output_tokens": 4}
    assert machine.usage == Usage(input_tokens=3, output_tokens=4)
    assert machine.stop_reason == "end_turn"


def test_thinking_block_gets_a_signature_delta_just_before_its_stop() -> None:
    _, events = run([START, ThinkingDelta(text="a"), ThinkingDelta(text="b"), Finish(reason="end_turn")])
    assert names(events)[1:6] == [
        "content_block_start:thinking",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
    ]


def test_text_after_tool_call_opens_a_new_block_never_reopens() -> None:
    _, events = run(
        [
            START,
            TextDelta(text="a"),
            ToolCallStart(index=0, id="c0", name="f"),
            ToolArgsDelta(index=0, json_fragment="{}"),
            TextDelta(text="b"),
            Finish(reason="end_turn"),
        ]
    )
    starts = [e.data["index"] for e in events if e.name == "content_block_start"]
    assert starts == [0, 1, 2]


def test_tool_arguments_map_upstream_index_to_block_index() -> None:
    _, events = run(
        [
            START,
            TextDelta(text="x"),
            ToolCallStart(index=0, id="a", name="f"),
            ToolArgsDelta(index=0, json_fragment='{"k":'),
            ToolArgsDelta(index=0, json_fragment="1}"),
            ToolCallStart(index=1, id="b", name="g"),
            ToolArgsDelta(index=1, json_fragment="{}"),
            ToolArgsDelta(index=0, json_fragment="late"),  # no longer collected: dropped
            ToolArgsDelta(index=7, json_fragment="stray"),  # never started: dropped
            Finish(reason="tool_use"),
        ]
    )
    assert input_deltas(events) == [(1, '{"k":1}'), (2, "{}")]  # each call whole, in one delta


def input_deltas(events: list[Event]) -> list[tuple[int, str]]:
    return [
        (e.data["index"], e.data["delta"]["partial_json"])
        for e in events
        if e.name == "content_block_delta" and e.data["delta"]["type"] == "input_json_delta"
    ]


NOT_AN_OBJECT = "The upstream produced tool call arguments that are not a JSON object."
CALL = ToolCallStart(index=0, id="call_1", name="f")


@pytest.mark.parametrize(
    "fragments", [["4120", "000000", "000.0"], ["fa", "lse"], ["[1,", "2]"], ['"Par', 'is"'], ["city", "=Paris"],
                  ['{"a": 1}', ' {"b": 2}'], ['{"a": ', "1"]],
)  # fmt: skip
@pytest.mark.parametrize("reason", ["tool_use", "end_turn", "stop_sequence", "content_filter"])
def test_arguments_that_are_not_an_object_end_the_stream_with_the_non_stream_verdict(
    fragments: list[str], reason: FinishReason
) -> None:
    events = [START, TextDelta(text="Checking."), CALL, *(ToolArgsDelta(index=0, json_fragment=f) for f in fragments),
              Finish(reason=reason), UsageReport(usage=Usage(input_tokens=1, output_tokens=4))]  # fmt: skip
    machine, parsed = run(events)
    assert names(parsed) == [
        "message_start", "content_block_start:text", "content_block_delta:text_delta", "content_block_stop", "error",
    ]  # fmt: skip
    assert parsed[-1].data == {"type": "error", "error": {"type": "api_error", "message": NOT_AN_OBJECT}}
    assert machine.failure is not None and machine.failure.kind == "upstream-protocol-error"
    assert machine.failure.status == 502 and machine.stop_reason is None
    with pytest.raises(UpstreamProtocolError, match=NOT_AN_OBJECT):  # what the same answer gets unstreamed
        tool_input("".join(fragments))


def test_a_bad_call_fails_the_stream_when_the_next_call_starts() -> None:
    _, parsed = run([START, CALL, ToolArgsDelta(index=0, json_fragment="5"), ToolCallStart(index=1, id="b", name="g"),
                     ToolArgsDelta(index=1, json_fragment="{}"), Finish(reason="tool_use")])  # fmt: skip
    assert names(parsed) == ["message_start", "error"]


def test_text_after_a_bad_call_is_never_sent() -> None:
    _, parsed = run([START, CALL, ToolArgsDelta(index=0, json_fragment="[]"), TextDelta(text="after"),
                     ThinkingDelta(text="more"), Finish(reason="end_turn")])  # fmt: skip
    assert names(parsed) == ["message_start", "error"]


def test_a_call_is_sent_whole_once_complete() -> None:
    machine = AnthropicStream("m")
    held = machine.feed_many([START, CALL, ToolArgsDelta(index=0, json_fragment='{"city": '),
                              ToolArgsDelta(index=0, json_fragment='"Paris"} ')])  # fmt: skip
    assert b"tool_use" not in b"".join(held) and machine.phase is Phase.TOOL_USE and machine.blocks == 0
    frames = held + machine.feed(Finish(reason="tool_use")) + machine.finish()
    parsed = check_anthropic_stream(frames)
    assert names(parsed)[1:4] == ["content_block_start:tool_use", "content_block_delta:input_json_delta",
                                  "content_block_stop"]  # fmt: skip
    assert parsed[1].data["content_block"] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {}}
    assert input_deltas(parsed) == [(0, '{"city": "Paris"}')]
    assert parsed[-2].data["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("fragments", [[], [" ", "\n"]])
def test_empty_arguments_are_the_empty_input(fragments: list[str]) -> None:
    _, parsed = run([START, CALL, *(ToolArgsDelta(index=0, json_fragment=f) for f in fragments),
                     Finish(reason="tool_use")])  # fmt: skip
    assert names(parsed) == ["message_start", "content_block_start:tool_use", "content_block_stop", "message_delta",
                             "message_stop"]  # fmt: skip


def test_a_call_cut_by_max_tokens_is_left_out_as_unstreamed() -> None:
    events = [START, TextDelta(text="a"), CALL, ToolArgsDelta(index=0, json_fragment='{"city": "Pa'),
              Finish(reason="max_tokens")]  # fmt: skip
    _, parsed = run(events)
    assert names(parsed) == ["message_start", "content_block_start:text", "content_block_delta:text_delta",
                             "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert parsed[-2].data["delta"]["stop_reason"] == "max_tokens"
    # a complete call before the cut is kept, as a non-streamed answer keeps it
    _, parsed = run([START, CALL, ToolArgsDelta(index=0, json_fragment="{}"), Finish(reason="max_tokens")])
    assert names(parsed)[1:4] == ["content_block_start:tool_use", "content_block_delta:input_json_delta",
                                  "content_block_stop"]  # fmt: skip


def test_error_mid_stream_ends_without_message_stop() -> None:
    machine, events = run(
        [START, TextDelta(text="a"), StreamError(kind="upstream-error", message="boom", status=502)]
    )
    assert names(events) == [
        "message_start",
        "content_block_start:text",
        "content_block_delta:text_delta",
        "error",
    ]
    assert events[-1].data == {"type": "error", "error": {"type": "api_error", "message": "boom"}}
    assert machine.phase is Phase.FAILED and machine.failure is not None and machine.message_started


def test_error_before_anything_is_only_an_error_frame() -> None:
    machine = AnthropicStream("m")
    frames = machine.feed(StreamError(kind="upstream-rejected", message="no", status=400))
    assert len(frames) == 1 and frames[0].startswith(b"event: error\n")
    assert not machine.message_started and machine.finish() == []


def test_ending_without_finish_reason_is_an_error_not_a_success() -> None:
    machine = AnthropicStream("m")
    frames = machine.feed_many([START, TextDelta(text="a")]) + machine.finish()
    events = check_anthropic_stream(frames)
    assert events[-1].data["error"] == {"type": "api_error", "message": NO_FINISH}


def test_queue_frame_bytes() -> None:
    assert queue_frame(2, 5) == b'event: queue\ndata: {"type":"queue","position":2,"queued":5}\n\n'


def test_grammar_checker_rejects_queue_frames_unless_asked_and_after_message_start() -> None:
    machine = AnthropicStream("m")
    body = machine.feed_many([START, TextDelta(text="a"), Finish(reason="end_turn")]) + machine.finish()
    queued = [queue_frame(1, 1), b": keep-alive\n\n", *body]
    assert check_anthropic_stream(queued, allow_queue=True)
    for stream, allow in ((queued, False), ([*body[:1], queue_frame(1, 1), *body[1:]], True)):
        try:
            check_anthropic_stream(stream, allow_queue=allow)
        except GrammarError:
            continue
        raise AssertionError("accepted a misplaced queue frame")


# --- property: any valid canonical sequence yields a valid Anthropic stream ---------------

REASONS: list[FinishReason] = ["end_turn", "max_tokens", "stop_sequence", "tool_use", "content_filter"]
text = st.text(max_size=8)
usage = st.builds(Usage, input_tokens=st.integers(0, 10**6), output_tokens=st.integers(0, 10**6))


@st.composite
def canonical_streams(draw: st.DrawFn) -> list[StreamEvent]:
    """MessageStart?, then content (thinking, text, tool calls in order, usage) interleaved freely,
    then a Finish (+usage) or a StreamError, or nothing (the outbound adapter's guarantee aside)."""
    events: list[StreamEvent] = []
    if draw(st.booleans()):
        events.append(MessageStart(id=draw(st.text(max_size=12)), model="m", created=0))
    calls = 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["think", "text", "tool", "args", "usage"]))
        if kind == "think":
            events.append(ThinkingDelta(text=draw(text)))
        elif kind == "text":
            events.append(TextDelta(text=draw(text)))
        elif kind == "tool":
            events.append(ToolCallStart(index=calls, id=draw(st.text(max_size=10)), name="f"))
            events.append(ToolArgsDelta(index=calls, json_fragment='{"x": '))
            events.append(ToolArgsDelta(index=calls, json_fragment=json.dumps(draw(text)) + "}"))
            calls += 1
        elif kind == "args" and calls:
            events.append(ToolArgsDelta(index=draw(st.integers(0, calls)), json_fragment=" "))
        elif kind == "usage":
            events.append(UsageReport(usage=draw(usage)))
    ending = draw(st.sampled_from(["finish", "error", "none"]))
    if ending == "finish":
        events.append(Finish(reason=draw(st.sampled_from(REASONS)), stop_sequence=draw(st.none() | text)))
        if draw(st.booleans()):
            events.append(UsageReport(usage=draw(usage)))
    elif ending == "error":
        events.append(
            StreamError(
                kind="upstream-error",
                message=draw(text),
                status=draw(st.sampled_from([400, 500, 502, 503, 504])),
            )
        )
    return events


@settings(max_examples=400, deadline=None)
@given(canonical_streams(), st.integers(1, 4))
def test_any_canonical_sequence_yields_the_anthropic_grammar(events: list[StreamEvent], chunk: int) -> None:
    machine = AnthropicStream("m")
    frames: list[bytes] = []
    for i in range(0, len(events), chunk):  # chunking must not matter
        frames += machine.feed_many(events[i : i + chunk])
    frames += machine.finish()
    assert machine.finish() == []
    parsed = check_anthropic_stream(frames)
    finished = any(isinstance(e, Finish) for e in events)
    assert (parsed[-1].name == "message_stop") == (
        finished and not any(isinstance(e, StreamError) for e in events)
    )
    text_sent = "".join(
        e.data["delta"]["text"]
        for e in parsed
        if e.name == "content_block_delta" and e.data["delta"]["type"] == "text_delta"
    )
    if finished:
        assert text_sent == "".join(e.text for e in events if isinstance(e, TextDelta))
        last_usage = [e.usage for e in events if isinstance(e, UsageReport)]
        assert parsed[-2].data["usage"]["output_tokens"] == (
            last_usage[-1].output_tokens if last_usage else 0
        )
