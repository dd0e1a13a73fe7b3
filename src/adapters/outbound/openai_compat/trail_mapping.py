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
from .wire import TEXT_DECODER, ChunkChoice, ChunkView, TextChoice, TextCompletionView

_DONE = b"[DONE]"


class TrailTextChoice(TextChoice):
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None  # the first chunk's


class TrailTextView(TextCompletionView):
    """A text completion stream's payload with vLLM's token ids: one decode gives the mapper its
    text and finish and the trail its ids (`note_text`)."""

    prompt_token_ids: list[int] | None = None
    choices: list[TrailTextChoice] = []  # type: ignore[assignment]


TRAIL_TEXT_DECODER = msgspec.json.Decoder(TrailTextView)


def decode_text(payload: bytes) -> tuple[TextCompletionView, TrailTextView | None]:
    """A text completion payload's view, twice the same one when its ids decode (one decode);
    ids that do not decode as ids are read past: the payload is decoded without them, for the
    mapper alone (None: nothing to note). Raises `msgspec.DecodeError` for a payload that is not
    a completion chunk at all."""
    try:
        view = TRAIL_TEXT_DECODER.decode(payload)
    except msgspec.DecodeError:
        return TEXT_DECODER.decode(payload), None
    return view, view


def note_text(trail: TokenTrail, view: TrailTextView) -> None:
    """What one text completion payload adds to the trail: the prompt's ids, choice 0's ids and
    whether its text reached the client."""
    if view.prompt_token_ids is not None and trail.prompt is None:
        trail.prompt = view.prompt_token_ids
    for choice in view.choices:
        if choice.index == 0:
            if choice.prompt_token_ids is not None and trail.prompt is None:
                trail.prompt = choice.prompt_token_ids
            trail.note(choice.token_ids, bool(choice.text))
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


class TrailBreaks:
    """A trail mapper's own failures (the connection, a timeout, a body without a finish) are
    breaks another replica can mend: every error chunk the mapper makes itself marks the trail."""

    __slots__ = ()
    trail: TokenTrail

    def _fail(self, error: GatewayError) -> StreamChunk:
        chunk: StreamChunk = super()._fail(error)  # type: ignore[misc]
        mark_break(self.trail, chunk, False)
        return chunk


class TrailStreamMapper(TrailBreaks, StreamMapper):
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


class TrailTextMapper(TrailBreaks, TextStreamMapper):
    """`TextStreamMapper` for a text completion stream with token ids (see the module doc)."""

    __slots__ = ("trail",)
    relays = False  # `native` is dropped: its token ids need no cut

    def __init__(self, trail: TokenTrail) -> None:
        super().__init__()
        self.trail = trail

    def feed(self, payload: bytes) -> StreamChunk | None:
        view = None
        if payload and payload != _DONE and not self.ended:
            try:
                view, ids = decode_text(payload)
            except msgspec.DecodeError:
                pass  # the base words it
        if view is None:
            chunk = super().feed(payload)
        else:
            if ids is not None:
                note_text(self.trail, ids)
            chunk = self._mapped(view, payload)
        if chunk is not None:
            mark_break(self.trail, chunk, chunk.native is not None)
            chunk.native = None
        return chunk
