"""vLLM text completions and embeddings -> canonical: answers, and a completion's stream.

Like the chat mapping (`stream_mapping.py`): every chunk carries its upstream payload, less
vLLM's token-id members (`token_ids.py`), as `native` (format `openai-completion`), so an
OpenAI-shaped surface relays it untouched otherwise (logprobs, `echo`ed prompts and all); only
choice 0 produces canonical events, and a stream ends in a `Finish` or a `StreamError`, never
silently.
"""

from __future__ import annotations

import msgspec

from domain.canonical import (
    ChunkBatch,
    MessageStart,
    NativePayload,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    Usage,
    UsageReport,
)
from domain.completions import Completion, Embeddings
from domain.errors import GatewayError, UpstreamError, UpstreamProtocolError, UpstreamRejected

from .finish_reasons import error_event, map_finish
from .sse_decoder import blocks_of, payload_of
from .stream_mapping import Phase
from .token_ids import without_token_ids
from .wire import EMBEDDINGS_DECODER, TEXT_DECODER, ErrorFields, TextCompletionView, UsageView

COMPLETION_FORMAT = "openai-completion"
EMBEDDINGS_FORMAT = "openai-embeddings"
_DONE = b"[DONE]"


def _usage(view: UsageView | None) -> Usage:
    return Usage() if view is None else Usage(input_tokens=view.prompt_tokens, output_tokens=view.completion_tokens)


def _refused(view: ErrorFields) -> GatewayError:
    return UpstreamError(view.error_message() or "upstream reported an error")


def completion_from_body(raw: bytes) -> Completion:
    try:
        view = TEXT_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"malformed upstream completion: {exc}") from None
    if view.is_error:
        raise _refused(view)
    choice = next((c for c in view.choices if c.index == 0), None)
    if choice is None or choice.finish_reason is None:
        raise UpstreamProtocolError("upstream completion has no finished choice")
    finish = map_finish(choice.finish_reason, choice.stop_reason, False)
    if isinstance(finish, StreamError):
        raise UpstreamError(finish.message)
    return Completion(id=view.id, model=view.model, created=view.created, text=choice.text or "",
                      finish_reason=finish.reason, usage=_usage(view.usage),
                      native=NativePayload(format=COMPLETION_FORMAT, data=without_token_ids(raw, view)))


def embeddings_from_body(raw: bytes) -> Embeddings:
    try:
        view = EMBEDDINGS_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"malformed upstream embeddings: {exc}") from None
    if view.is_error:
        raise _refused(view)
    vectors = [item.embedding for item in sorted(view.data, key=lambda item: item.index)]
    return Embeddings(model=view.model, vectors=vectors, usage=_usage(view.usage),
                      native=NativePayload(format=EMBEDDINGS_FORMAT, data=raw))


class TextStreamMapper:
    """A streamed completion's `data` payloads -> canonical chunks (see `StreamMapper`)."""

    __slots__ = ("phase",)
    # Its payloads go on to the client as `native`, cut of their token ids; a mapper that drops
    # `native` (`trail_mapping.TrailTextMapper`) need not cut them.
    relays = True

    def __init__(self) -> None:
        self.phase = Phase.IDLE

    @property
    def ended(self) -> bool:
        return self.phase is Phase.DONE or self.phase is Phase.FAILED

    def feed(self, payload: bytes) -> StreamChunk | None:
        if self.ended or not payload:
            return None
        if payload == _DONE:
            if self.phase is Phase.FINISHED:
                self.phase = Phase.DONE
                return None
            return self._fail(UpstreamProtocolError("upstream stream ended without a finish_reason"))
        try:
            view = TEXT_DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            return self._fail(UpstreamProtocolError(f"malformed upstream stream chunk: {exc}"))
        return self._mapped(view, payload)

    def _mapped(self, view: TextCompletionView, payload: bytes) -> StreamChunk:
        """The chunk of one decoded payload (not `[DONE]`)."""
        native = NativePayload(format=COMPLETION_FORMAT,
                               data=without_token_ids(payload, view) if self.relays else payload)
        if view.is_error:
            status = view.error_code() or UpstreamError.status
            kind = UpstreamRejected.kind if status < 500 else UpstreamError.kind
            self.phase = Phase.FAILED
            message = view.error_message() or "upstream reported an error mid-stream"
            return StreamChunk(events=[StreamError(kind=kind, message=message, status=status)], native=native)
        events: list[StreamEvent] = []
        if self.phase is Phase.IDLE:
            self.phase = Phase.OPEN
            events.append(MessageStart(id=view.id, model=view.model, created=view.created))
        choice = next((c for c in view.choices if c.index == 0), None)
        if choice is not None:
            if choice.text:
                events.append(TextDelta(text=choice.text))
            if choice.finish_reason is not None and self.phase is Phase.OPEN:
                finish = map_finish(choice.finish_reason, choice.stop_reason, False)
                events.append(finish)
                self.phase = Phase.FAILED if isinstance(finish, StreamError) else Phase.FINISHED
        if view.usage is not None:
            at = len(events) - 1 if self.phase is Phase.FAILED else len(events)
            events.insert(at, UsageReport(usage=_usage(view.usage)))
        return StreamChunk(events=events, native=native)

    def token_read(self, data: bytes) -> ChunkBatch | None:
        """No shortcut for a completion's one-token read: `feed_events` maps every read."""
        return None

    def feed_events(self, data: bytes) -> ChunkBatch:
        """Each whole event's payload as `feed` maps it, up to a failure."""
        batch: ChunkBatch = []
        for block in blocks_of(data):
            payload = payload_of(block)
            chunk = self.feed(payload) if payload is not None else None
            if chunk is not None:
                batch.append(chunk)
                if self.phase is Phase.FAILED:
                    break
        return batch

    def close(self) -> StreamChunk | None:
        if self.ended or self.phase is Phase.FINISHED:
            return None
        return self._fail(UpstreamProtocolError("upstream stream ended without a finish_reason"))

    def fail(self, error: GatewayError) -> StreamChunk | None:
        if self.ended or self.phase is Phase.FINISHED:
            return None
        return self._fail(error)

    def _fail(self, error: GatewayError) -> StreamChunk:
        self.phase = Phase.FAILED
        return StreamChunk(events=[error_event(error)])
