"""The outbound side of a resume: vLLM's token ids fill the trail (and never reach a client's
frames), a break is marked, and a continuation maps a text completion back into the answer
(`trail_mapping.py`, `continuation.py`)."""

from __future__ import annotations

import json

import msgspec

from adapters.outbound.openai_compat.continuation import ContinuationMapper, encode_continuation
from adapters.outbound.openai_compat.trail_mapping import TrailStreamMapper, TrailTextMapper
from domain.canonical import (
    ChatRequest,
    Finish,
    Message,
    MessageStart,
    StreamError,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ToolChoice,
    ToolSpec,
    UsageReport,
)
from domain.completions import CompletionRequest
from domain.errors import UpstreamError
from domain.resume import UNBOUNDED, TokenTrail, not_resumable, remaining_tokens
from domain.sampling import Sampling
from domain.upstream_failures import FailureKind


def chat_chunk(
    delta: dict | None = None, ids: list[int] | None = None, finish: str | None = None, **top: object
) -> bytes:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish, "token_ids": ids}
    return json.dumps({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [choice], **top}).encode()


def text_chunk(text: str, ids: list[int] | None, finish: str | None = None, **extra: object) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "token_ids": ids, **extra}
    return json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                       "choices": [choice]}).encode()


def test_a_chat_stream_fills_the_trail_and_relays_no_upstream_bytes() -> None:
    trail = TokenTrail()
    mapper = TrailStreamMapper(trail)
    first = mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]))
    assert first is not None and isinstance(first.events[0], MessageStart) and first.native is None
    for i, word in enumerate(["alpha", " bravo"]):
        chunk = mapper.feed(chat_chunk({"content": word}, [100 + i]))
        assert chunk is not None and chunk.events == [TextDelta(text=word)] and chunk.native is None
    held = mapper.feed(chat_chunk({}, [150]))  # a token whose text vLLM held back
    assert held is not None and held.events == []
    assert (trail.prompt, trail.generated, trail.vouched) == ([1, 2, 3], [100, 101, 150], 2)
    assert trail.continuation_prompt() == [1, 2, 3, 100, 101]


def test_thinking_is_noted_as_such() -> None:
    trail = TokenTrail()
    mapper = TrailStreamMapper(trail)
    mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]))
    mapper.feed(chat_chunk({"reasoning": "Let"}, [200]))
    assert trail.reasoning
    mapper.feed(chat_chunk({}, [299]))  # the end marker, swallowed by the reasoning parser
    assert trail.reasoning and trail.vouched == 1
    mapper.feed(chat_chunk({"content": "alpha"}, [100]))
    assert not trail.reasoning and trail.vouched == 3


def test_a_connection_that_fails_mid_answer_marks_the_break() -> None:
    trail = TokenTrail()
    mapper = TrailStreamMapper(trail)
    mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]))
    chunk = mapper.fail(UpstreamError("connection failed mid-answer", failure=FailureKind.AFTER_HEAD))
    assert chunk is not None and isinstance(chunk.events[-1], StreamError)
    assert trail.broken == "connection failed mid-answer" and trail.resumable_now()


def test_a_body_that_ends_without_a_finish_marks_the_break_and_a_4xx_error_does_not() -> None:
    trail = TokenTrail()
    mapper = TrailStreamMapper(trail)
    mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]))
    assert mapper.close() is not None and trail.broken is not None
    other = TokenTrail()
    mapper = TrailStreamMapper(other)
    mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]))
    error = json.dumps({"error": {"message": "bad", "type": "BadRequestError", "code": 400}}).encode()
    chunk = mapper.feed(error)
    assert chunk is not None and isinstance(chunk.events[-1], StreamError) and other.broken is None


def test_a_half_written_tool_call_cannot_be_resumed() -> None:
    trail = TokenTrail()
    mapper = TrailStreamMapper(trail)
    mapper.feed(chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1]))
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{"}}
    mapper.feed(chat_chunk({"tool_calls": [call]}, [300]))
    mapper.fail(UpstreamError("connection failed mid-answer"))
    assert trail.broken is not None and not trail.resumable_now()


def test_a_text_completion_stream_takes_its_prompt_ids_from_the_choice() -> None:
    trail = TokenTrail()
    mapper = TrailTextMapper(trail)
    chunk = mapper.feed(text_chunk("alpha", [100], prompt_token_ids=[5, 6]))
    assert chunk is not None and chunk.native is None
    assert (trail.prompt, trail.generated, trail.vouched) == ([5, 6], [100], 1)


def continued(trail: TokenTrail) -> ContinuationMapper:
    trail.prompt = trail.prompt or [1, 2]
    trail.restart()
    return ContinuationMapper(trail)


def test_a_continuation_goes_on_with_text_and_reports_the_whole_usage() -> None:
    trail = TokenTrail()
    trail.prompt = [1, 2]
    trail.note([100, 101], True)
    mapper = continued(trail)
    chunk = mapper.feed(text_chunk(" charlie", [102], prompt_token_ids=[1, 2, 100, 101]))
    assert chunk is not None and chunk.events == [TextDelta(text=" charlie")]  # no MessageStart
    end = mapper.feed(text_chunk("", [], finish="stop"))
    assert end is not None and end.events == [Finish(reason="end_turn")]
    usage = json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m", "choices": [],
                        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}}).encode()
    report = mapper.feed(usage)
    assert report is not None and isinstance(report.events[0], UsageReport)
    assert (report.events[0].usage.input_tokens, report.events[0].usage.output_tokens) == (2, 3)
    assert trail.generated == [100, 101, 102] and trail.vouched == 3


def test_a_continuation_inside_the_thinking_splits_at_the_end_marker_even_when_it_is_cut() -> None:
    trail = TokenTrail()
    trail.prompt = [1]
    trail.note([200], True, reasoning=True)
    mapper = continued(trail)
    seen = []
    for text, token in [(" me", 201), (" </", 202), ("think>", 203), ("alpha", 100)]:
        chunk = mapper.feed(text_chunk(text, [token]))
        assert chunk is not None
        seen.extend(chunk.events)
        if token == 202:  # held back: it may begin the marker, so its id is not vouched for yet
            assert trail.vouched == 2 and trail.reasoning
    assert seen == [ThinkingDelta(text=" me"), ThinkingDelta(text=" "), TextDelta(text="alpha")]
    assert not trail.reasoning and trail.vouched == 5


def test_held_back_thinking_is_given_at_the_finish() -> None:
    trail = TokenTrail()
    trail.prompt = [1]
    trail.note([200], True, reasoning=True)
    mapper = continued(trail)
    first = mapper.feed(text_chunk(" <", [201]))
    assert first is not None and first.events == []
    last = mapper.feed(text_chunk("", [], finish="length"))
    assert last is not None and last.events == [ThinkingDelta(text=" <"), Finish(reason="max_tokens")]


def test_the_continuation_body_is_the_trail_with_the_same_sampling_and_fewer_tokens() -> None:
    trail = TokenTrail()
    trail.prompt = [1, 2]
    trail.note([100, 101, 102], True)
    trail.note([150], False)  # held back: generated again
    request = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])],
                          max_tokens=10, temperature=0.0, sampling=Sampling(seed=7), cache_salt="s")
    body = msgspec.json.decode(encode_continuation(request, trail))
    assert body == {"model": "m", "prompt": [1, 2, 100, 101, 102], "max_tokens": 7, "temperature": 0.0, "seed": 7,
                    "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
                    "cache_salt": "s"}


def test_what_cannot_be_resumed() -> None:
    base = ChatRequest(model="m", messages=[])
    assert not_resumable(base) is None
    assert not_resumable(msgspec.structs.replace(base, n=2)) == "several sequences"
    assert not_resumable(msgspec.structs.replace(base, stop=["x"])) == "stop strings"
    assert not_resumable(msgspec.structs.replace(base, logprobs=True)) == "logprobs"
    assert not_resumable(msgspec.structs.replace(base, sampling=Sampling(response_format={"type": "json_object"}))) \
        == "structured output"
    assert not_resumable(msgspec.structs.replace(base, sampling=Sampling(response_format={"type": "text"}))) is None
    assert not_resumable(CompletionRequest(model="m", prompt=["a"])) is None
    assert not_resumable(msgspec.structs.replace(base, tools=[ToolSpec(name="f")])) == "tools"
    assert not_resumable(msgspec.structs.replace(base, tools=[ToolSpec(name="f")],
                                                 tool_choice=ToolChoice(mode="none"))) is None
    assert not_resumable(CompletionRequest(model="m", prompt=["a"], echo=True)) is not None


def test_a_budgeted_thinking_is_resumed_only_once_it_is_over() -> None:
    trail = TokenTrail(budgeted=True)
    trail.prompt = [1]
    assert not trail.resumable_now()  # nothing yet: a continuation would think without the budget
    trail.note([200], True, reasoning=True)
    assert not trail.resumable_now()
    trail.note([299], False)
    trail.note([100], True)
    assert trail.resumable_now()


def test_a_continuation_asks_for_what_is_left() -> None:
    trail = TokenTrail()
    trail.prompt = [1]
    trail.note([100, 101], True)
    chat = ChatRequest(model="m", messages=[])
    assert remaining_tokens(msgspec.structs.replace(chat, max_tokens=10), trail) == 8
    assert remaining_tokens(chat, trail) == UNBOUNDED  # vLLM cuts it to the model's room
    assert remaining_tokens(CompletionRequest(model="m", prompt=["a"]), trail) == 14  # 16, the default


def test_completion_ids_that_are_not_ids_are_read_past_and_the_text_still_mapped() -> None:
    trail = TokenTrail()
    mapper = TrailTextMapper(trail)
    mapper.feed(text_chunk("alpha", [100], prompt_token_ids=[5, 6]))
    chunk = mapper.feed(text_chunk(" bravo", ["x"]))  # type: ignore[list-item]
    assert chunk is not None and chunk.events == [TextDelta(text=" bravo")] and chunk.native is None
    assert (trail.generated, trail.vouched) == ([100], 1)
    later = continued(trail)
    chunk = later.feed(text_chunk(" charlie", "not ids"))  # type: ignore[arg-type]
    assert chunk is not None and chunk.events == [TextDelta(text=" charlie")]
    assert trail.generated == [100]


def test_each_completion_mapper_marks_its_own_failures_as_breaks() -> None:
    for make in (TrailTextMapper, continued):
        trail = TokenTrail()
        trail.prompt = [1, 2]
        mapper = make(trail)
        mapper.feed(text_chunk("alpha", [100]))
        chunk = mapper.close()
        assert chunk is not None and isinstance(chunk.events[-1], StreamError)
        assert trail.broken == chunk.events[-1].message
        trail = TokenTrail()
        trail.prompt = [1, 2]
        mapper = make(trail)
        chunk = mapper.fail(UpstreamError("connection failed mid-answer"))
        assert chunk is not None and trail.broken == "connection failed mid-answer"
        assert mapper.feed(b"not json") is None and mapper.close() is None  # ended: nothing more
        trail = TokenTrail()
        trail.prompt = [1, 2]
        chunk = make(trail).feed(b"not json")
        assert chunk is not None and trail.broken is not None and chunk.native is None
