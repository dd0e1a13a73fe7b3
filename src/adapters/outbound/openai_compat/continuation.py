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
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    Usage,
    UsageReport,
)
from domain.completions import CompletionRequest
from domain.errors import UpstreamError, UpstreamProtocolError, UpstreamRejected
from domain.resume import REASONING_END, TokenTrail, remaining_tokens

from .completion_mapping import TextStreamMapper
from .finish_reasons import map_finish
from .stream_mapping import Phase
from .trail_mapping import TrailBreaks, TrailTextView, decode_text, mark_break, note_text

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


class ContinuationMapper(TrailBreaks, TextStreamMapper):
    """A continuation's `data` payloads -> more of the broken answer's canonical chunks; reads,
    the end of the body and failures as `TextStreamMapper`'s, its own failures breaks of the
    trail (`TrailBreaks`)."""

    __slots__ = ("_base", "_pending", "_reasoning", "trail")

    def __init__(self, trail: TokenTrail) -> None:
        super().__init__()
        self.phase = Phase.OPEN  # the answer's MessageStart was sent by the first stream
        self.trail = trail
        self._base = trail.vouched  # generated tokens the client had before this continuation
        self._reasoning = trail.reasoning
        # Chunks of thinking not shown yet (their end may begin the end marker): (text, how
        # many ids had been generated after it).
        self._pending: list[tuple[str, int]] = []

    def feed(self, payload: bytes) -> StreamChunk | None:
        if self.ended or not payload:
            return None
        if payload == _DONE:
            if self.phase is Phase.FINISHED:
                self.phase = Phase.DONE
                return None
            return self._fail(UpstreamProtocolError("upstream stream ended without a finish_reason"))
        try:
            view, ids = decode_text(payload)
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
            self._text(choice.text or "", ids, events)
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

    def _text(self, text: str, ids: TrailTextView | None, events: list[StreamEvent]) -> None:
        """Note the ids (`ids`: the payload's view, if they decoded) and map the text: thinking
        up to the end marker, answer text after.

        Thinking whose end may begin the marker is held back whole chunk by whole chunk (a
        token's text cannot be split), and its ids are not vouched for until it is shown."""
        trail = self.trail
        vouched = trail.vouched
        if ids is not None:
            note_text(trail, ids)
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


def _marker_prefix(text: str) -> int:
    """How many of `text`'s last characters begin the reasoning's end marker."""
    for size in range(min(len(text), len(REASONING_END) - 1), 0, -1):
        if REASONING_END.startswith(text[-size:]):
            return size
    return 0
