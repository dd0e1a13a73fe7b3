"""The mappers of a resumable stream: they fill a `domain.resume.TokenTrail` as chunks arrive.

The gateway asks vLLM for token ids (`return_token_ids`) only for a request it could resume;
the ids are its own business, so no chunk of such a stream carries its payload on to the client
(`native` is dropped and the dialect encodes the canonical events; the learnt-shape shortcuts of
`StreamMapper` are off, every payload is decoded, once, with its ids).

A break another replica can mend sets `trail.broken`: the connection failed or timed out
(`fail`), the body ended without a finish (`close`), or the server wrote a 5xx error mid-stream.
The chunk with the `StreamError` is produced as always; the caller decides whether to resume.
"""

from __future__ import annotations

import msgspec

from domain.canonical import (
    MessageStart,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
)
from domain.errors import GatewayError
from domain.resume import TokenTrail

from .completion_mapping import TextStreamMapper
from .stream_mapping import Phase, StreamMapper
from .wire import ChunkChoice, ChunkView, View

_DONE = b"[DONE]"


class IdsDelta(View):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[msgspec.Raw] | None = None


class IdsChoice(View):
    index: int = 0
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None  # a text completion's (first chunk)
    delta: IdsDelta | None = None
    text: str | None = None  # a text completion's
    finish_reason: str | None = None


class IdsView(View):
    prompt_token_ids: list[int] | None = None  # a chat stream's (first chunk)
    choices: list[IdsChoice] = []


IDS_DECODER = msgspec.json.Decoder(IdsView)


def note_payload(trail: TokenTrail, payload: bytes) -> None:
    """What one payload adds to the trail: the prompt's ids, choice 0's ids and whether its
    text (or a tool call's part) reached the client. Undecodable payloads add nothing (the
    mapper words the error)."""
    try:
        view = IDS_DECODER.decode(payload)
    except msgspec.DecodeError:
        return
    if view.prompt_token_ids is not None and trail.prompt is None:
        trail.prompt = view.prompt_token_ids
    for choice in view.choices:
        if choice.index != 0:
            continue
        if choice.prompt_token_ids is not None and trail.prompt is None:
            trail.prompt = choice.prompt_token_ids
        delta = choice.delta
        if delta is None:
            trail.note(choice.token_ids, bool(choice.text))
            return
        thinking = delta.reasoning or delta.reasoning_content
        if delta.tool_calls:
            trail.tool_open = choice.finish_reason is None
        trail.note(choice.token_ids, bool(thinking or delta.content or delta.tool_calls), bool(thinking)
                   and not delta.content)  # fmt: skip
        return


def mark_break(trail: TokenTrail, chunk: StreamChunk | None, from_upstream: bool) -> None:
    """Set `trail.broken` if `chunk` ends the stream with an error another replica could mend:
    one the gateway saw (`from_upstream` False: the connection, a timeout, no finish) or a 5xx
    the server wrote."""
    if chunk is None or not chunk.events:
        return
    last = chunk.events[-1]
    if isinstance(last, StreamError) and (not from_upstream or last.status >= 500):
        trail.broken = last.message


class TrailChoice(ChunkChoice):
    token_ids: list[int] | None = None


class TrailChunkView(ChunkView):
    """A chat stream's payload with vLLM's token ids: one decode gives the mapper all it needs."""

    prompt_token_ids: list[int] | None = None
    choices: list[TrailChoice] = []  # type: ignore[assignment]


TRAIL_CHUNK_DECODER = msgspec.json.Decoder(TrailChunkView)


class TrailStreamMapper(StreamMapper):
    """`StreamMapper` for a chat stream with token ids (see the module doc): every payload is
    decoded once, with its ids; errors, `[DONE]` and what does not decode take the base path."""

    __slots__ = ("trail",)

    def __init__(self, trail: TokenTrail) -> None:
        super().__init__()
        self._tries = 0  # no learnt shape: every payload carries ids, and each is read
        self.trail = trail

    def feed(self, payload: bytes) -> StreamChunk | None:
        if not payload or payload == _DONE or self.ended:
            return super().feed(payload)
        try:
            view = TRAIL_CHUNK_DECODER.decode(payload)
        except msgspec.DecodeError:
            view = None
        if view is None or view.is_error:  # the base words it (a 5xx is a break)
            chunk = super().feed(payload)
            if chunk is not None:
                mark_break(self.trail, chunk, chunk.native is not None)
                chunk.native = None
            return chunk
        trail = self.trail
        if view.prompt_token_ids is not None and trail.prompt is None:
            trail.prompt = view.prompt_token_ids
        events: list[StreamEvent] = []
        if self.phase is Phase.IDLE:
            self.phase = Phase.OPEN
            self._message_id = view.id
            events.append(MessageStart(id=view.id, model=view.model, created=view.created))
        for choice in view.choices:
            if choice.index == 0:
                before = len(events)
                self._choice(choice, events)
                delta = choice.delta
                if delta is not None and delta.tool_calls:
                    trail.tool_open = choice.finish_reason is None
                texts = events[before:]
                shown = any(isinstance(e, TextDelta | ThinkingDelta | ToolCallStart | ToolArgsDelta) for e in texts)
                trail.note(choice.token_ids, shown, shown and not any(isinstance(e, TextDelta) for e in texts))
                break
        if view.usage is not None:
            self._usage(view.usage.usage(), events)
        chunk = StreamChunk(events=events)
        mark_break(trail, chunk, True)  # `finish_reason: "abort"` is a StreamError
        return chunk

    def close(self) -> StreamChunk | None:
        chunk = super().close()
        mark_break(self.trail, chunk, False)
        return chunk

    def fail(self, error: GatewayError) -> StreamChunk | None:
        chunk = super().fail(error)
        mark_break(self.trail, chunk, False)
        return chunk


class TrailTextMapper(TextStreamMapper):
    """`TextStreamMapper` for a text completion stream with token ids (see the module doc)."""

    __slots__ = ("trail",)
    relays = False  # `native` is dropped: its token ids need no cut

    def __init__(self, trail: TokenTrail) -> None:
        super().__init__()
        self.trail = trail

    def feed(self, payload: bytes) -> StreamChunk | None:
        if payload and payload != _DONE and not self.ended:
            note_payload(self.trail, payload)
        chunk = super().feed(payload)
        if chunk is not None:
            mark_break(self.trail, chunk, chunk.native is not None)
            chunk.native = None
        return chunk

    def close(self) -> StreamChunk | None:
        chunk = super().close()
        mark_break(self.trail, chunk, False)
        return chunk

    def fail(self, error: GatewayError) -> StreamChunk | None:
        chunk = super().fail(error)
        mark_break(self.trail, chunk, False)
        return chunk
