"""A continuation: the rest of a broken answer, asked of another replica as a text completion
whose prompt is the answer's token ids so far (`domain.resume`), mapped as more of that answer.

The request: vLLM's `/v1/completions` with `prompt` the trail's ids, the same model, sampling
and cache salt, `max_tokens` what the client allowed less what it has, `return_token_ids`
(a second break resumes again). The stream: no `MessageStart` (the client has one); the text
goes on where the answer was, thinking (`ThinkingDelta`) until the reasoning's end marker, then
answer text (`TextDelta`): a text completion runs no reasoning parser, so the marker is found
here, even when it arrives cut across chunks. Usage is the whole answer's: the prompt counted
once, every generated token once (what was sent again is the gateway's cost, not the client's).
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.canonical import (
    ChatRequest,
    ChunkBatch,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    Usage,
    UsageReport,
)
from domain.completions import CompletionRequest
from domain.errors import GatewayError, UpstreamError, UpstreamProtocolError, UpstreamRejected
from domain.resume import REASONING_END, TokenTrail, remaining_tokens

from .finish_reasons import error_event, map_finish
from .sse_decoder import blocks_of, payload_of
from .stream_mapping import Phase
from .trail_mapping import mark_break, note_payload
from .wire import TEXT_DECODER

_ENCODER = msgspec.json.Encoder()
_DONE = b"[DONE]"
_SAMPLING = ("temperature", "top_p", "top_k")


def encode_continuation(request: ChatRequest | CompletionRequest, trail: TokenTrail) -> bytes:
    """The body of the continuation of `request`'s answer (see the module doc)."""
    body: dict[str, Any] = {"model": request.model, "prompt": trail.continuation_prompt()}
    body["max_tokens"] = remaining_tokens(request, trail)
    for name in _SAMPLING:
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    for name, value in request.sampling.fields():
        body[name] = value
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body["return_token_ids"] = True
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    return _ENCODER.encode(body)


class ContinuationMapper:
    """A continuation's `data` payloads -> more of the broken answer's canonical chunks."""

    __slots__ = ("_base", "_pending", "_reasoning", "phase", "trail")

    def __init__(self, trail: TokenTrail) -> None:
        self.phase = Phase.OPEN  # the answer's MessageStart was sent by the first stream
        self.trail = trail
        self._base = trail.vouched  # generated tokens the client had before this continuation
        self._reasoning = trail.reasoning
        # Chunks of thinking not shown yet (their end may begin the end marker): (text, how
        # many ids had been generated after it).
        self._pending: list[tuple[str, int]] = []

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
        if view.is_error:
            status = view.error_code() or UpstreamError.status
            kind = UpstreamRejected.kind if status < 500 else UpstreamError.kind
            self.phase = Phase.FAILED
            message = view.error_message() or "upstream reported an error mid-stream"
            chunk = StreamChunk(events=[StreamError(kind=kind, message=message, status=status)])
            mark_break(self.trail, chunk, True)
            return chunk
        events: list[StreamEvent] = []
        choice = next((c for c in view.choices if c.index == 0), None)
        if choice is not None:
            self._text(choice.text or "", payload, events)
            if choice.finish_reason is not None and self.phase is Phase.OPEN:
                if self._pending:
                    events.append(ThinkingDelta(text="".join(piece for piece, _ in self._pending)))
                    self.trail.vouched = len(self.trail.generated)
                    self._pending.clear()
                finish = map_finish(choice.finish_reason, choice.stop_reason, False)
                events.append(finish)
                self.phase = Phase.FAILED if isinstance(finish, StreamError) else Phase.FINISHED
        if view.usage is not None:
            usage = Usage(input_tokens=len(self.trail.prompt or ()),
                          output_tokens=self._base + view.usage.completion_tokens)  # fmt: skip
            at = len(events) - 1 if self.phase is Phase.FAILED else len(events)
            events.insert(at, UsageReport(usage=usage))
        return StreamChunk(events=events)

    def _text(self, text: str, payload: bytes, events: list[StreamEvent]) -> None:
        """Note the ids and map the text: thinking up to the end marker, answer text after.

        Thinking whose end may begin the marker is held back whole chunk by whole chunk (a
        token's text cannot be split), and its ids are not vouched for until it is shown."""
        trail = self.trail
        vouched = trail.vouched
        note_payload(trail, payload)
        if not self._reasoning:
            if text:
                events.append(TextDelta(text=text))
            return
        trail.vouched, trail.reasoning = vouched, True  # vouched for below, as the text is shown
        pending = self._pending
        if text:
            pending.append((text, len(trail.generated)))
        held = "".join(piece for piece, _ in pending)
        end = held.find(REASONING_END)
        if end >= 0:
            thinking, answer = held[:end], held[end + len(REASONING_END) :]
            if thinking:
                events.append(ThinkingDelta(text=thinking))
            if answer:
                events.append(TextDelta(text=answer))
            self._reasoning = trail.reasoning = False
            trail.vouched = len(trail.generated)
            pending.clear()
            return
        keep = _marker_prefix(held)
        shown, count = 0, 0
        for piece, _ in pending:
            if len(held) - shown - len(piece) < keep:
                break
            shown += len(piece)
            count += 1
        if count:
            events.append(ThinkingDelta(text=held[:shown]))
            trail.vouched = pending[count - 1][1]
            del pending[:count]

    def token_read(self, data: bytes) -> ChunkBatch | None:
        return None

    def feed_events(self, data: bytes) -> ChunkBatch:
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
        chunk = StreamChunk(events=[error_event(error)])
        mark_break(self.trail, chunk, False)
        return chunk


def _marker_prefix(text: str) -> int:
    """How many of `text`'s last characters begin the reasoning's end marker."""
    for size in range(min(len(text), len(REASONING_END) - 1), 0, -1):
        if REASONING_END.startswith(text[-size:]):
            return size
    return 0
