"""A `TextRun` (the texts of one read's token frames, one object) is, to every consumer, the
`TextDelta`s it stands for: each dialect writes the same bytes, the usage estimate counts the
same deltas, whether the run comes while a text block is open, before any, or after the end."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from tests.support.events import flat

from adapters.inbound.anthropic.stream import AnthropicStream
from adapters.inbound.openai.stream import ChunkWriter
from adapters.inbound.responses.mapping import decode_request as decode_responses
from adapters.inbound.responses.stream import ResponseStream
from domain.canonical import (
    ChatRequest,
    Finish,
    Message,
    MessageStart,
    StreamChunk,
    StreamEvent,
    TextDelta,
    TextPart,
    TextRun,
    ThinkingDelta,
    Usage,
    UsageReport,
)
from domain.usage_estimate import UsageMeter

_START = MessageStart(id="c1", model="m", created=5)
_RUN = TextRun(texts=["Hel", "lo", " \u00e9\n", '"q"'])
_END: list[StreamEvent] = [Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=3, output_tokens=4))]
# Each stream as its chunks: a run first in a message, after a delta opened the block, after thinking
# (another block), between deltas, and after the finish (nothing is added to a finished answer).
STREAMS: list[list[list[StreamEvent]]] = [
    [[_START], [_RUN], _END],
    [[_START, TextDelta(text="a")], [_RUN], _END],
    [[_START, ThinkingDelta(text="hmm")], [_RUN, TextDelta(text="z")], _END],
    [[_START], [TextDelta(text="a"), _RUN, TextDelta(text="b")], [_RUN], _END],
    [[_START, TextDelta(text="a")], [Finish(reason="end_turn"), _RUN], [_END[1]]],
]


def _anthropic(chunks: list[list[StreamEvent]]) -> bytes:
    machine = AnthropicStream("m")
    return b"".join(frame for events in chunks for frame in machine.feed_many(events)) + b"".join(machine.finish())


def _responses(chunks: list[list[StreamEvent]]) -> bytes:
    call = decode_responses(msgspec.json.encode({"model": "m", "input": "hi", "stream": True}), "rid",
                            created_at=1700000000)
    machine = ResponseStream(call.template, call.tools)
    return b"".join(machine.feed(events) for events in chunks) + machine.finish()


def _openai(chunks: list[list[StreamEvent]]) -> bytes:  # chunks without `native`: the writer encodes them
    writer = ChunkWriter(True, "m", "r1")
    return b"".join(writer.feed(StreamChunk(events=events)) for events in chunks) + writer.finish()


@pytest.mark.parametrize("write", [_anthropic, _responses, _openai], ids=["llm", "responses", "v1"])
@pytest.mark.parametrize("chunks", STREAMS)
def test_a_run_writes_what_its_deltas_write(write: Callable[[list[list[StreamEvent]]], bytes],
                                            chunks: list[list[StreamEvent]]) -> None:
    assert write(chunks) == write([flat(events) for events in chunks])


@pytest.mark.parametrize("chunks", STREAMS)
def test_the_estimate_counts_a_runs_texts(chunks: list[list[StreamEvent]]) -> None:
    request = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])])
    runs, deltas = UsageMeter(request), UsageMeter(request)
    for events in chunks:
        runs.feed_batch([StreamChunk(events=[e for e in events if type(e) is not UsageReport])])
        deltas.feed_batch([StreamChunk(events=[e for e in flat(events) if type(e) is not UsageReport])])
    assert runs.usage() == deltas.usage()
    texts = sum(type(e) in (TextDelta, ThinkingDelta) for events in chunks for e in flat(events))
    assert runs.usage().output_tokens == texts
