"""The SSE decoder must give the same payloads however the bytes are cut."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.outbound.openai_compat.sse_decoder import SseDecoder, SseOverflow

TRANSCRIPT = (
    b": keep-alive comment\n\n"
    b'data: {"id":"a","choices":[]}\n\n'
    b"event: message\n"
    b"data: line one\n"
    b"data: line two\n"
    b"id: 7\n"
    b"retry: 100\n\n"
    b"data:no-space\n\n"
    b"event: nodata\n\n"
    b"data: crlf\r\n\r\n"
    b"data\n\n"
    b"\n\n"
    b"data:  two spaces\r\ndata: mixed\n\n"
    b"data: [DONE]\n\n"
    b"data: unterminated"
)
EXPECTED = [
    b'{"id":"a","choices":[]}',
    b"line one\nline two",
    b"no-space",
    b"crlf",
    b"",
    b" two spaces\nmixed",
    b"[DONE]",
]


def feed_all(chunks: list[bytes]) -> list[bytes]:
    decoder = SseDecoder()
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def test_whole_buffer() -> None:
    assert feed_all([TRANSCRIPT]) == EXPECTED


def test_byte_by_byte() -> None:
    assert feed_all([TRANSCRIPT[i : i + 1] for i in range(len(TRANSCRIPT))]) == EXPECTED


def test_unterminated_event_is_held_not_emitted() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: partial") == []
    assert decoder.pending == len(b"data: partial")
    assert decoder.feed(b" end\n\n") == [b"partial end"]
    assert decoder.pending == 0


def test_crlf_only_stream() -> None:
    body = b'data: {"a":1}\r\n\r\n: ping\r\n\r\ndata: x\r\ndata: y\r\n\r\n'
    assert feed_all([body]) == [b'{"a":1}', b"x\ny"]
    assert feed_all([body[i : i + 1] for i in range(len(body))]) == [b'{"a":1}', b"x\ny"]


def test_many_events_in_one_read() -> None:
    body = b"".join(b"data: %d\n\n" % i for i in range(1000))
    assert feed_all([body]) == [b"%d" % i for i in range(1000)]


def test_oversized_event_is_refused() -> None:
    decoder = SseDecoder(max_event_bytes=64)
    with pytest.raises(SseOverflow):
        decoder.feed(b"data: " + b"x" * 100)


@given(st.lists(st.integers(min_value=0, max_value=len(TRANSCRIPT)), max_size=40))
def test_random_splits_match_whole_feed(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(TRANSCRIPT)]
    chunks = [TRANSCRIPT[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all(chunks) == EXPECTED


_text = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=20)
_event = st.tuples(
    st.lists(_text, min_size=0, max_size=3),  # data lines
    st.booleans(),  # preceded by a comment
    st.booleans(),  # has an event: line
    st.sampled_from([b"\n", b"\r\n"]),  # line ending
)


@given(st.lists(_event, max_size=12), st.data())
def test_generated_streams(events: list[tuple[list[str], bool, bool, bytes]], data: st.DataObject) -> None:
    body = bytearray()
    expected: list[bytes] = []
    for lines, comment, named, eol in events:
        if comment:
            body += b": note" + eol
        if named:
            body += b"event: chunk" + eol
        for line in lines:
            body += b"data: " + line.encode() + eol
        body += eol
        if lines:
            expected.append(b"\n".join(line.encode() for line in lines))
    raw = bytes(body)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=20))
    bounds = [0, *sorted(cuts), len(raw)]
    chunks = [raw[a:b] for a, b in itertools.pairwise(bounds)]
    assert feed_all([raw]) == expected
    assert feed_all(chunks) == expected


@given(st.lists(_event, min_size=1, max_size=12), st.data())
def test_reads_of_whole_events_match_the_general_parse(
    events: list[tuple[list[str], bool, bool, bytes]], data: st.DataObject
) -> None:
    """Reads that end on an event's end (the usual case, taken by one split when every event
    is one `data: ` line) give what the line-by-line parse gives."""
    frames: list[bytes] = []
    for lines, comment, named, eol in events:
        frame = (b": note" + eol if comment else b"") + (b"event: chunk" + eol if named else b"")
        frames.append(frame + b"".join(b"data: " + line.encode() + eol for line in lines) + eol)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=len(frames)))) | {len(frames)})
    reads = [b"".join(frames[a:b]) for a, b in itertools.pairwise([0, *cuts])]
    assert feed_all(reads) == feed_all([bytes([b]) for b in b"".join(frames)])


def test_a_read_of_plain_events_then_one_of_other_shapes() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n\n") == [b"a", b"b"]
    assert decoder.feed(b"data: c\n\n: note\n\ndata: d\r\n\r\n") == [b"c", b"d"]
    assert decoder.feed(b"data: e\n\n\n") == [b"e"]  # a blank line after: nothing more
    assert decoder.feed(b"data: f\n\n") == [b"f"]
    assert decoder.feed(b"data: g\ndata: h\n\n") == [b"g\nh"]
    assert decoder.pending == 0
