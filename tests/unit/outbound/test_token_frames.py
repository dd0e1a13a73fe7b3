"""Reads of whole events (`sse_decoder.whole_events` -> `StreamMapper.feed_events`) map exactly as
the payload-by-payload path does, and `/v1` relays the same bytes.

The reference is the general path with a mapper that never learns a token shape: every payload
fully decoded. The fast path must give the same canonical events, end in the same phase and,
through `/v1`'s `ChunkWriter`, send the same bytes (model renamed or not), however the stream's
events are cut into reads and whatever the payloads hold, valid or not.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable
from typing import Any, cast

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.events import flat_events

from adapters.inbound.openai.stream import ChunkWriter
from adapters.outbound.openai_compat.chunk_stream import ChunkStream
from adapters.outbound.openai_compat.sse_decoder import SseDecoder, whole_events
from adapters.outbound.openai_compat.stream_mapping import Phase, StreamMapper
from adapters.outbound.openai_compat.token_frames import TOKEN_FRAMES_FORMAT
from domain.canonical import NativePayload, StreamChunk, TextDelta, TextRun

_ID = b'{"id":"c1","object":"chat.completion.chunk","created":5,"model":"up","choices":'
_ROLE = _ID + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
_HEAD = _ID + b'[{"index":0,"delta":{"content":'
_TAIL = b'},"logprobs":null,"finish_reason":null}]}'
_FINISH = _ID + b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}'
_USAGE = _ID + b'[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}'

# Texts between the learnt bytes: JSON strings (escapes, empty, non-ASCII) and things that are not one.
_BAD_TEXTS = [b'"a" "b"', b'"unterminated', b'"raw \x01 control"', b'"bad \\x escape"', b'"\xff"', b"1", b"null",
              b'"a"},"x":{"content":"b"', b"", b'"', b'"\\u12"', b'"new\nline"']
_ODD_EVENTS = [
    b": keep-alive",  # a comment
    b"event: chunk\ndata: " + _HEAD + b'"named"' + _TAIL,  # another field before the data
    b"data: " + _HEAD + b'"two' + b'\ndata: lines"' + _TAIL,  # one payload in two lines
    b"data:" + _HEAD + b'"no space"' + _TAIL,
    b"data: " + _HEAD.replace(b'"created":5', b'"created":6') + b'"moved"' + _TAIL,  # another shape
    b"data: " + _HEAD + b'"x","reasoning":"r"' + _TAIL,
    b"data: " + _HEAD.replace(b'"index":0', b'"index":1') + b'"other choice"' + _TAIL,
    b"",  # an extra blank line
]

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
_token = st.one_of(
    _text.map(lambda text: b"data: " + _HEAD + msgspec.json.encode(text) + _TAIL),
    st.sampled_from(_BAD_TEXTS).map(lambda raw: b"data: " + _HEAD + raw + _TAIL),
    st.sampled_from(_ODD_EVENTS),
)


def _events_of(body: list[bytes]) -> list[bytes]:
    return [b"data: " + _ROLE, *body, b"data: " + _FINISH, b"data: " + _USAGE, b"data: [DONE]"]


class _Reads:
    """`ChunkStream`'s `Reader` over reads already there: one per `start()`, b"" once they are
    over (the body's end); nothing ever waits."""

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter(reads)
        self.reading = False

    def start(self) -> Awaitable[bytes]:
        self.reading = True
        return _ready(next(self._reads, b""))

    def beat(self) -> bool:
        return False

    def failure(self, exc: Exception) -> Any:
        raise AssertionError(exc)

    def close(self) -> None:
        pass


async def _ready(data: bytes) -> bytes:
    return data


def _streamed(reads: list[bytes], mapper: Any) -> list[StreamChunk]:
    """What `ChunkStream` makes of the reads, through its `__anext__`: with reads that never
    wait, each call runs to its end on its first step (no event loop needed)."""
    stream = ChunkStream(cast(Any, None), _Reads(reads), mapper)
    chunks: list[StreamChunk] = []
    while True:
        try:
            stream.__anext__().send(None)
        except StopIteration as batch:
            chunks += batch.value
        except StopAsyncIteration:
            return chunks


def _fast(reads: list[bytes]) -> tuple[list[StreamChunk], StreamMapper]:
    mapper = StreamMapper()
    return _streamed(reads, mapper), mapper


def _reference(reads: list[bytes]) -> tuple[list[StreamChunk], StreamMapper]:
    decoder, mapper = SseDecoder(), StreamMapper()
    mapper._tries = 0  # never learns: every payload takes the full decode
    chunks: list[StreamChunk] = []
    for data in reads:
        for payload in decoder.feed(data):
            chunk = mapper.feed(payload)
            if chunk is not None:
                chunks.append(chunk)
                if mapper.phase is Phase.FAILED:
                    return chunks, mapper
        if mapper.ended:
            break
    return chunks, mapper


def _sent(chunks: list[StreamChunk], model: str) -> bytes:
    writer = ChunkWriter(True, model, "r1")
    return b"".join(writer.feed(chunk) for chunk in chunks) + writer.finish()


def _same(reads: list[bytes]) -> list[StreamChunk]:
    fast, fast_mapper = _fast(reads)
    slow, slow_mapper = _reference(reads)
    assert flat_events(fast) == flat_events(slow)  # a run's `TextRun`: the `TextDelta`s of its payloads
    assert fast_mapper.phase is slow_mapper.phase
    for model in ("up", "alias"):  # as asked; renamed for a client that used an alias
        assert _sent(fast, model) == _sent(slow, model)
    return fast


@settings(max_examples=300)
@given(st.lists(_token, max_size=30), st.data())
def test_reads_of_whole_events_map_and_relay_as_payload_by_payload(body: list[bytes], data: st.DataObject) -> None:
    events = _events_of(body)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=len(events)))) | {len(events)})
    reads = [b"".join(event + b"\n\n" for event in events[a:b]) for a, b in itertools.pairwise([0, *cuts])]
    _same(reads)


@settings(max_examples=200)
@given(st.lists(_token, max_size=20), st.data())
def test_reads_cut_anywhere_map_and_relay_as_payload_by_payload(body: list[bytes], data: st.DataObject) -> None:
    raw = b"".join(event + b"\n\n" for event in _events_of(body))
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=len(raw) - 1), max_size=8)))
    _same([raw[a:b] for a, b in itertools.pairwise([0, *cuts, len(raw)])])


def test_a_read_of_tokens_is_one_chunk_relayed_as_the_upstream_wrote_it() -> None:
    tokens = [b"data: " + _HEAD + msgspec.json.encode(text) + _TAIL + b"\n\n" for text in ["a", "", "b\n", "c"]]
    first = b"data: " + _ROLE + b"\n\n" + tokens[0]  # the shape is learnt from the first token
    chunks = _same([first, b"".join(tokens[1:]), b"data: " + _FINISH + b"\n\ndata: [DONE]\n\n"])
    run = chunks[2]
    assert run.native is not None and run.native.format == TOKEN_FRAMES_FORMAT
    assert run.native.data == b"".join(tokens[1:])  # the empty text is relayed, not an event
    assert run.events == [TextRun(texts=["b\n", "c"])]  # one object for the run's texts


def test_a_malformed_token_in_a_run_fails_the_stream_where_it_stands() -> None:
    token = b"data: " + _HEAD + b'"ok"' + _TAIL + b"\n\n"
    read = token * 2 + b"data: " + _HEAD + b'"a" "b"' + _TAIL + b"\n\n" + token
    chunks = _same([b"data: " + _ROLE + b"\n\n" + token, read])
    assert chunks[-1].events[0].kind == "upstream-protocol-error"  # type: ignore[union-attr]
    assert chunks[-2].events == [TextRun(texts=["ok", "ok"])]


def test_a_shape_seen_across_two_data_lines_is_not_learnt() -> None:
    """A token payload sent as two `data` lines is joined with an LF: its bytes around the text
    are not the bytes of any one-line event. An event holding those bytes with the LF is two
    lines to SSE (the second an unknown field): the first line alone is its payload, malformed."""
    split_head = _HEAD.replace(b'"object"', b'\n"object"')
    two_lines = b"data: " + split_head.replace(b"\n", b"\ndata: ") + b'"a"' + _TAIL + b"\n\n"
    lookalike = b"data: " + split_head + b'"b"' + _TAIL + b"\n\n"
    for reads in ([b"data: " + _ROLE + b"\n\n" + two_lines, lookalike],
                  [b"data: " + _ROLE + b"\n\n" + two_lines, lookalike + b"data: " + _FINISH + b"\n\n"]):
        chunks = _same(reads)
        assert chunks[-1].events[0].kind == "upstream-protocol-error"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [b"data: a\n\ndata: b", b"data: a\r\n\r\n", b"data: a\n\n\n", b"data: a\n", b"data: a\n\r\n\n",
     b"data: a\n\n\n\n", b": ping\n\ndata: a\n\n", b"data:a\n\n", b"event: x\ndata: a\n\n", b"tial\n\n"],
)
def test_other_reads_take_the_general_parse(data: bytes) -> None:
    assert not whole_events(data)


@pytest.mark.parametrize("data", [b"data: a\n\n", b"data: a\n\n\ndata: b\n\n", b"data: a\ndata: b\n\n: c\n\n"])
def test_reads_of_whole_events_from_a_data_line(data: bytes) -> None:
    assert whole_events(data)


def test_a_read_with_something_pending_takes_the_general_parse() -> None:
    token = b"data: " + _HEAD + b'"b"' + _TAIL + b"\n\n"
    first = b"data: " + _ROLE + b"\n\n" + token + token[:20]  # the shape is learnt; a token's start waits
    chunks = _same([first, token[20:] + token, b"data: " + _FINISH + b"\n\ndata: [DONE]\n\n"])
    assert [type(event).__name__ for event in flat_events(chunks)] == [
        "MessageStart", "TextDelta", "TextDelta", "TextDelta", "Finish"]


def test_events_between_tokens_and_after_blank_lines_keep_their_place() -> None:
    token = b"data: " + _HEAD + b'"t"' + _TAIL + b"\n\n"
    two_lines = b"data: " + _HEAD.replace(b'"object"', b'\ndata: "object"') + b'"m"' + _TAIL + b"\n\n"
    read = (token + b": ping\n\n" + token + b"\n\n" + token + b"event: chunk\ndata: " + _HEAD + b'"n"' + _TAIL
            + b"\n\n" + token + two_lines + token)
    chunks = _same([b"data: " + _ROLE + b"\n\n" + token, read, b"data: " + _FINISH + b"\n\ndata: [DONE]\n\n"])
    texts = [event.text for event in flat_events(chunks) if isinstance(event, TextDelta)]
    assert texts == ["t", "t", "t", "t", "n", "t", "m", "t"]  # "n" and "m": events of other shapes, decoded
    # A token whose part holds more (a comment, a blank line, another field: an LF) is mapped as its
    # payload (`feed`), one followed by the next event's `data: ` line joins a run of frames.
    formats = [chunk.native.format for chunk in chunks if chunk.native is not None]
    assert formats == ["openai-chat"] * 6 + [TOKEN_FRAMES_FORMAT, "openai-chat", TOKEN_FRAMES_FORMAT, "openai-chat"]
    assert chunks[6].native is not None and chunks[6].native.data == token


def test_a_text_completion_stream_maps_the_same_from_whole_events() -> None:
    """`/v1/completions` streams (`TextStreamMapper`) take the same reads the same way."""
    from adapters.outbound.openai_compat.completion_mapping import TextStreamMapper

    def frame(choice: bytes, usage: bytes = b"") -> bytes:
        return b'data: {"id":"t1","object":"text_completion","created":5,"model":"up","choices":[' + choice + b"]" \
            + usage + b"}\n\n"

    raw = (frame(b'{"index":0,"text":"a","finish_reason":null}') + b": note\n\n"
           + frame(b'{"index":0,"text":"b","finish_reason":null}')
           + b"event: x\n" + frame(b'{"index":0,"text":"c"}')
           + frame(b'{"index":0,"text":"","finish_reason":"stop"}')
           + frame(b"", b',"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}') + b"data: [DONE]\n\n")
    for reads in ([raw], [raw[:150], raw[150:]], [bytes([b]) for b in raw]):
        got = [event for chunk in _streamed(reads, TextStreamMapper()) for event in chunk.events]
        decoder, mapper = SseDecoder(), TextStreamMapper()
        want = [event for data in reads for payload in decoder.feed(data)
                for chunk in [mapper.feed(payload)] if chunk is not None for event in chunk.events]
        assert got == want and len(want) == 6  # start, a, b, c, finish, usage


@settings(max_examples=200)
@given(st.lists(_token, max_size=30))
def test_paced_reads_of_one_event_each_map_and_relay_as_payload_by_payload(body: list[bytes]) -> None:
    """A GPU's pace: every token in a read of its own (`StreamMapper.token_read`)."""
    _same([event + b"\n\n" for event in _events_of(body)])


def test_a_one_token_read_is_mapped_without_a_split() -> None:
    mapper = StreamMapper()
    token = b"data: " + _HEAD + b'"a\\nb"' + _TAIL + b"\n\n"
    empty = b"data: " + _HEAD + b'""' + _TAIL + b"\n\n"
    assert mapper.token_read(token) is None  # nothing learnt yet
    mapper.feed_events(b"data: " + _ROLE + b"\n\n" + token)  # learns the shape
    assert mapper.token_read(token) == [
        StreamChunk(events=[TextDelta(text="a\nb")], native=NativePayload(format=TOKEN_FRAMES_FORMAT, data=token))]
    assert mapper.token_read(empty) == [StreamChunk(events=[], native=NativePayload(format=TOKEN_FRAMES_FORMAT,
                                                                                   data=empty))]
    for other in (token * 2, token[:-1], token + b"\n", b"data: " + _HEAD + b'"a" "b"' + _TAIL + b"\n\n",
                  b"data: " + _HEAD + b'"a\nb"' + _TAIL + b"\n\n", b"data: " + _FINISH + b"\n\n"):
        assert mapper.token_read(other) is None
    mapper.feed_events(b"data: " + _FINISH + b"\n\n")
    assert mapper.token_read(token) is None  # finished: a token now is the full decode's to judge


def test_a_token_shaped_read_after_a_partial_event_continues_that_event() -> None:
    """What is pending decides: `data: 1` + a token event is one malformed payload, not a token."""
    token = b"data: " + _HEAD + b'"ok"' + _TAIL + b"\n\n"
    chunks = _same([b"data: " + _ROLE + b"\n\n" + token, b"data: 1", token])
    assert chunks[-1].events[0].kind == "upstream-protocol-error"  # type: ignore[union-attr]
