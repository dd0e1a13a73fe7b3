"""Token events of a learnt shape, and runs of them as one chunk (`StreamMapper`'s fast paths).

Most payloads of a stream are tokens that differ from each other only in the text: vLLM
writes the same id, creation time, model and field order every time. Once one has been
decoded, its bytes around the text are kept, and a payload with the same bytes around one
JSON string is mapped by decoding that string alone. What the bytes around it mean is proven
once, by decoding them around a probe string (`token_shape`): the probe must come out as
choice 0's text and nothing else (no usage, no finish, no error). Anything else (a payload
that differs elsewhere, a text that is not one valid JSON string) takes the full decode,
which words any error.

A run of such token events in one read becomes one chunk (`run_chunk`) whose native payload
is the run's frames (`TOKEN_FRAMES_FORMAT`), each text between the learnt bytes less vLLM's
token-id members (`token_ids.cut_tail`): an OpenAI-shaped surface relays them as one slice,
the others read the run's non-empty texts (one `TextRun`, or a `TextDelta` for one text), the
texts single payloads would give.
"""

from __future__ import annotations

import msgspec

from domain.canonical import NativePayload, StreamChunk, StreamEvent, TextDelta, TextRun

from .wire import NEXT_CHUNK_DECODER

# NativePayload.data: whole SSE frames (`data: ` to the blank line) of openai-chat token payloads
TOKEN_FRAMES_FORMAT = "openai-chat-token-frames"
DATA = b"data: "
EVENT_END = b"\n\n"  # an SSE event's end
NEXT_DATA = b"\n\ndata: "  # an event's end and the next one's `data: ` line
_CONTENT_KEY = b'"content":'
_PROBE = b'"\\u0000gateway probe"'  # a JSON string no upstream text is confused with
_PROBE_TEXT = "\x00gateway probe"


def token_shape(payload: bytes) -> tuple[bytes, bytes] | None:
    """A token payload's bytes before and after its text, if they are proven to map any JSON
    string put between them to choice 0's text alone (see the module doc); None otherwise."""
    key = payload.rfind(_CONTENT_KEY)
    if key <= 0 or payload[key - 1] not in b"{,":
        return None
    start = key + len(_CONTENT_KEY)
    end = _string_end(payload, start)
    if end < 0:
        return None
    head, tail = payload[:start], payload[end:]
    if not tail:
        return None
    try:
        view = NEXT_CHUNK_DECODER.decode(b"".join((head, _PROBE, tail)))
    except msgspec.DecodeError:
        return None
    if view.error is not None or view.object == "error" or view.usage is not None:
        return None
    for choice in view.choices:
        if choice.index == 0:
            break
    else:
        return None
    if choice.finish_reason is not None:
        return None
    delta = choice.delta
    if (delta is None or delta.content != _PROBE_TEXT or delta.tool_calls is not None
            or delta.reasoning is not None or delta.reasoning_content is not None):
        return None
    if 10 in head or 10 in tail or 13 in head or 13 in tail:  # LF, CR (`10 in` is a memchr)
        return None  # a payload of several `data` lines: its event's bytes are not `data: ` + payload
    return head, tail


def run_chunk(texts: list[str], raws: list[bytes], relay: tuple[bytes, bytes, bytes]) -> StreamChunk:
    """A run of token events: their texts (one object for them all, not a `TextDelta` each: a
    `TextDelta` for one, as `StreamMapper.token_read` gives), their frames as relayed (each
    token event is `data: `, its payload and a blank line: no other line, no CR): every text
    as it came (`raws`, JSON strings), `relay`'s bytes before the first, between two and
    after the last."""
    frames = b"".join((relay[0], relay[1].join(raws), relay[2]))
    if len(texts) > 1:
        events: list[StreamEvent] = [TextRun(texts=texts)]
    else:
        events = [TextDelta(text=texts[0])] if texts else []
    return StreamChunk(events=events, native=NativePayload(format=TOKEN_FRAMES_FORMAT, data=frames))


def _string_end(data: bytes, start: int) -> int:
    """Where the JSON string literal starting at `start` ends (the index after its closing
    quote), or -1 if none starts there."""
    if data[start : start + 1] != b'"':
        return -1
    at = start + 1
    while True:
        quote = data.find(b'"', at)
        if quote < 0:
            return -1
        escapes = 0
        while data[quote - 1 - escapes] == 92:  # a backslash
            escapes += 1
        if not escapes % 2:
            return quote + 1
        at = quote + 1
