"""Canonical stream events -> Responses API stream events: a pure state machine, no I/O.

The grammar is what the SDKs' stream helpers (`client.responses.stream(...)`,
openai-python's `ResponseStreamState`) accumulate, every event numbered by
`sequence_number` from 0:

    response.created                      (status `queued` while waiting for a slot, then
    [response.queued]                      `response.queued`; else status `in_progress`)
    response.in_progress
    per output item, one after another (output_index 0, 1, ...):
      response.output_item.added
      reasoning: response.content_part.added, response.reasoning_text.delta*,
                 response.reasoning_text.done, response.content_part.done
      message:   response.content_part.added, response.output_text.delta*,
                 response.output_text.done, response.content_part.done
      function_call: response.function_call_arguments.delta*, .done
      response.output_item.done
    response.completed | response.incomplete (max_output_tokens, content filter)
    or, after a failure: error, then response.failed

Function calls stay open until something else starts or the answer ends (upstream
deltas of parallel calls may interleave); every other item closes when the next one
opens. The terminal event carries the whole Response (output and usage).
"""

from __future__ import annotations

import enum

import msgspec

from adapters.inbound._shared.sse import event_frame
from adapters.inbound.responses import objects as o
from adapters.inbound.responses.mapping import function_call, item_id, outcome, usage_out
from adapters.inbound.responses.tools import Toolset
from domain.canonical import (
    Finish,
    FinishReason,
    StreamError,
    StreamEvent,
    TextDelta,
    TextRun,
    ThinkingDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UsageReport,
)

NO_FINISH = "The upstream ended the stream without a finish reason."
_OUTPUT = frozenset({TextDelta, TextRun, ThinkingDelta, ToolCallStart, ToolArgsDelta})
# OpenAI's codes that clients act on (Codex compacts its history on `context_length_exceeded`).
_ERROR_CODES = {"context-length-exceeded": "context_length_exceeded", "rate-limited": "rate_limit_exceeded"}


class Phase(enum.Enum):
    IDLE = "idle"  # nothing sent
    QUEUED = "queued"  # response.created (queued) and response.queued sent
    OPEN = "open"  # response.in_progress sent: output items may follow
    FINISHED = "finished"  # the finish reason is known; usage may still come
    CLOSED = "closed"  # the terminal event was produced


class _Item:
    """An output item being streamed."""

    __slots__ = ("call_id", "chunks", "id", "index", "kind", "name")

    def __init__(self, kind: str, item_id: str, index: int, call_id: str = "", name: str = "") -> None:
        self.kind, self.id, self.index = kind, item_id, index
        self.call_id, self.name = call_id, name
        self.chunks: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.chunks)


class ResponseStream:
    """One Response's stream: `queued()`, `admitted()`, `feed(events)` per upstream chunk, then
    `finish()` or `fail(...)`; each returns the frames to send now (maybe none)."""

    __slots__ = ("_calls", "_open", "_output", "_seq", "_template", "_tools", "failure", "phase", "reason",
                 "usage")  # fmt: skip

    def __init__(self, template: o.ResponseObject, tools: Toolset) -> None:
        self._template = template
        self._tools = tools
        self._seq = 0
        self._output: list[o.OutputItem] = []  # finished items, by output_index
        self._open: _Item | None = None  # an open reasoning or message item
        self._calls: dict[int, _Item] = {}  # open function calls by the upstream's call index
        self.phase = Phase.IDLE
        self.reason: FinishReason | None = None
        self.usage: Usage | None = None  # the last usage the upstream reported
        self.failure: StreamError | None = None

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    @property
    def started(self) -> bool:
        """Whether output has begun (an item was added)."""
        return bool(self._output) or self._open is not None or bool(self._calls)

    # --- lifecycle ------------------------------------------------------------------

    def queued(self) -> bytes:
        """While the request waits for a slot: `response.created` and `response.queued`, once."""
        if self.phase is not Phase.IDLE:
            return b""
        self.phase = Phase.QUEUED
        return self._lifecycle("response.created", "queued") + self._lifecycle("response.queued", "queued")

    def admitted(self) -> bytes:
        """The request runs: `response.created` (unless sent while queued), `response.in_progress`."""
        if self.phase is Phase.OPEN or self.phase is Phase.FINISHED or self.phase is Phase.CLOSED:
            return b""
        out = self._lifecycle("response.created", "in_progress") if self.phase is Phase.IDLE else b""
        self.phase = Phase.OPEN
        return out + self._lifecycle("response.in_progress", "in_progress")

    def feed(self, events: list[StreamEvent]) -> bytes:
        out = [self.admitted()]
        for event in events:
            if self.phase is Phase.CLOSED:
                break
            kind = type(event)
            if self.phase is not Phase.OPEN and kind in _OUTPUT:
                continue  # nothing is added to an answer that finished
            if kind is TextDelta:
                if event.text:  # type: ignore[union-attr]  # an empty delta opens no item
                    out.append(self._text(event.text))  # type: ignore[union-attr]
            elif kind is TextRun:
                out += [self._text(text) for text in event.texts]  # type: ignore[union-attr]
            elif kind is ThinkingDelta:
                if event.text:  # type: ignore[union-attr]
                    out.append(self._thinking(event.text))  # type: ignore[union-attr]
            elif kind is ToolCallStart:
                out.append(self._call_start(event))  # type: ignore[arg-type]
            elif kind is ToolArgsDelta:
                out.append(self._call_args(event))  # type: ignore[arg-type]
            elif kind is UsageReport:
                self.usage = event.usage  # type: ignore[union-attr]
            elif kind is Finish:
                if self.phase is Phase.OPEN:
                    self.reason = event.reason  # type: ignore[union-attr]
                    self.phase = Phase.FINISHED
                    out.append(self._close_all())
            elif kind is StreamError:
                out.append(self.fail(event.kind, event.message, event.status))  # type: ignore[union-attr]
        return b"".join(out)

    def finish(self) -> bytes:
        """The terminal event once the upstream is done (idempotent)."""
        if self.phase is Phase.CLOSED:
            return b""
        if self.reason is None:
            return self.fail("upstream-protocol-error", NO_FINISH, 502)
        status, incomplete = outcome(self.reason)
        self.phase = Phase.CLOSED
        name = "response.incomplete" if status == "incomplete" else "response.completed"
        return self._lifecycle(name, status, incomplete=incomplete, output=True)

    def fail(self, kind: str, message: str, status: int) -> bytes:
        """A failure after the stream started: `error`, then `response.failed`."""
        if self.phase is Phase.CLOSED:
            return b""
        self.failure = StreamError(kind=kind, message=message, status=status)
        # The SDKs need `response.created` first, even for a Response that never ran.
        out = self._lifecycle("response.created", "in_progress") if self.phase is Phase.IDLE else b""
        self.phase = Phase.CLOSED
        code = _ERROR_CODES.get(kind) or ("server_error" if status >= 500 else "invalid_prompt")
        error = o.ErrorEvent(sequence_number=self._next(), code=code, message=message)
        failed = o.ResponseErrorInfo(code=code, message=message)
        return out + event_frame(b"error", o.encode(error)) + self._lifecycle("response.failed", "failed",
                                                                                error=failed, output=True)

    # --- items ----------------------------------------------------------------------

    def _text(self, text: str) -> bytes:
        item = self._open
        out = b""
        if item is None or item.kind != "message":
            out = self._close_all()
            item = self._start("message", "msg")
            message = o.OutputMessage(id=item.id, status="in_progress", content=[])
            out += self._item_event("response.output_item.added", item.index, message)
            out += self._part_event("response.content_part.added", item, o.OutputTextPart(text=""))
        item.chunks.append(text)
        delta = o.TextDeltaEvent(sequence_number=self._next(), item_id=item.id, output_index=item.index, delta=text)
        return out + event_frame(b"response.output_text.delta", o.encode(delta))

    def _thinking(self, text: str) -> bytes:
        item = self._open
        out = b""
        if item is None or item.kind != "reasoning":
            out = self._close_all()
            item = self._start("reasoning", "rs")
            reasoning = o.ReasoningOut(id=item.id, status="in_progress")
            out += self._item_event("response.output_item.added", item.index, reasoning)
            out += self._part_event("response.content_part.added", item, o.ReasoningTextPart(text=""))
        item.chunks.append(text)
        delta = o.ReasoningDeltaEvent(sequence_number=self._next(), item_id=item.id, output_index=item.index,
                                      delta=text)
        return out + event_frame(b"response.reasoning_text.delta", o.encode(delta))

    def _call_start(self, event: ToolCallStart) -> bytes:
        out = self._close_open()
        if event.index in self._calls:  # the same call started twice: keep the first
            return out
        index = self._next_index()
        item = _Item("function_call", item_id("fc", self._template, index), index, call_id=event.id, name=event.name)
        self._calls[event.index] = item
        call = function_call(self._template, self._tools, item.index, item.call_id, item.name, "", "in_progress")
        return out + self._item_event("response.output_item.added", item.index, call)

    def _call_args(self, event: ToolArgsDelta) -> bytes:
        item = self._calls.get(event.index)
        if item is None or not event.json_fragment:
            return b""
        item.chunks.append(event.json_fragment)
        delta = o.ArgumentsDeltaEvent(sequence_number=self._next(), item_id=item.id, output_index=item.index,
                                      delta=event.json_fragment)
        return event_frame(b"response.function_call_arguments.delta", o.encode(delta))

    def _next_index(self) -> int:
        return len(self._output) + len(self._calls) + (self._open is not None)

    def _start(self, kind: str, prefix: str) -> _Item:
        index = self._next_index()
        item = self._open = _Item(kind, item_id(prefix, self._template, index), index)
        return item

    def _close_all(self) -> bytes:
        return self._close_open() + self._close_calls()

    def _close_open(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        status = self._item_status()
        text = item.text
        if item.kind == "message":
            part: o.OutputTextPart | o.ReasoningTextPart = o.OutputTextPart(text=text)
            done = o.TextDoneEvent(sequence_number=self._next(), item_id=item.id, output_index=item.index, text=text)
            out = event_frame(b"response.output_text.done", o.encode(done))
            finished: o.OutputItem = o.OutputMessage(id=item.id, status=status, content=[part])  # type: ignore[list-item]
        else:
            part = o.ReasoningTextPart(text=text)
            reasoning_done = o.ReasoningDoneEvent(sequence_number=self._next(), item_id=item.id,
                                                  output_index=item.index, text=text)
            out = event_frame(b"response.reasoning_text.done", o.encode(reasoning_done))
            finished = o.ReasoningOut(id=item.id, content=[part], status=status)
        out += self._part_event("response.content_part.done", item, part)
        self._output.append(finished)
        return out + self._item_event("response.output_item.done", item.index, finished)

    def _close_calls(self) -> bytes:
        calls, self._calls = self._calls, {}
        out: list[bytes] = []
        status = self._item_status()
        for item in sorted(calls.values(), key=lambda i: i.index):
            arguments = item.text
            call = function_call(self._template, self._tools, item.index, item.call_id, item.name, arguments, status)
            done = o.ArgumentsDoneEvent(sequence_number=self._next(), item_id=item.id, output_index=item.index,
                                        name=call.name, arguments=arguments)
            out.append(event_frame(b"response.function_call_arguments.done", o.encode(done)))
            self._output.append(call)
            out.append(self._item_event("response.output_item.done", item.index, call))
        return b"".join(out)

    def _item_status(self) -> str:
        return "incomplete" if self.reason == "max_tokens" or self.reason == "content_filter" else "completed"

    # --- framing --------------------------------------------------------------------

    def _next(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _item_event(self, name: str, index: int, item: o.OutputItem) -> bytes:
        event = o.ItemEvent(type=name, sequence_number=self._next(), output_index=index, item=item)
        return event_frame(name.encode(), o.encode(event))

    def _part_event(self, name: str, item: _Item, part: o.OutputTextPart | o.ReasoningTextPart) -> bytes:
        event = o.PartEvent(type=name, sequence_number=self._next(), item_id=item.id, output_index=item.index,
                            content_index=0, part=part)
        return event_frame(name.encode(), o.encode(event))

    def _lifecycle(self, name: str, status: str, *, incomplete: o.IncompleteDetails | None = None,
                   error: o.ResponseErrorInfo | None = None, output: bool = False) -> bytes:
        response = msgspec.structs.replace(
            self._template, status=status, incomplete_details=incomplete, error=error,
            output=list(self._output) if output else [], usage=usage_out(self.usage or Usage()) if output else None,
        )
        event = o.LifecycleEvent(type=name, sequence_number=self._next(), response=response)
        return event_frame(name.encode(), o.encode(event))
