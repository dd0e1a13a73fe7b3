"""Canonical stream chunks -> OpenAI `chat.completion.chunk` SSE frames.

When the upstream already speaks this dialect (native format `openai-chat`, or a run of
token frames, `openai-chat-token-frames`), its frames are relayed byte for byte: nothing
is re-encoded and fields the canonical model does not name (logprobs, n > 1 choices)
survive. Otherwise the canonical events are encoded. Either way this writer decides what
the client may see (the usage-only chunk only if it asked for usage), ends every stream
with `[DONE]`, and remembers usage and finish reason for the request record.
"""

from __future__ import annotations

import enum
import time

from adapters.inbound.openai import schema as w
from adapters.inbound.openai.answers import finish_reason, renamed, usage_out
from adapters.inbound.openai.errors import stream_error_frame
from domain.canonical import (
    Finish,
    MessageStart,
    StreamChunk,
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

NATIVE_FORMAT = "openai-chat"
# A run of token frames as the upstream sent them (`data: ` ... blank line), one TextDelta per
# non-empty text among the events: relayed as they are.
TOKEN_FRAMES_FORMAT = "openai-chat-token-frames"
DONE = b"data: [DONE]\n\n"
_END = b"\n\n"


class Phase(enum.Enum):
    OPEN = "open"  # frames may still be sent
    CLOSED = "closed"  # the terminal frame was produced; nothing follows


_OPEN, _CLOSED = Phase.OPEN, Phase.CLOSED  # bound once: an Enum member lookup costs ~60 ns on Python 3.11


class ChunkWriter:
    """Turns each `StreamChunk` into the bytes to send now (possibly none).

    `feed` returns the frames for one upstream chunk; after a `StreamError` it has
    returned the error frame and `[DONE]`, and the stream is closed. `finish` returns
    `[DONE]` once, and nothing if the stream is already closed.
    """

    __slots__ = ("_created", "_id", "_model", "_rename", "_role_sent", "error", "finish_reason",
                 "include_usage", "phase", "usage")  # fmt: skip

    def __init__(self, include_usage: bool, model: str, request_id: str) -> None:
        self.phase = _OPEN
        self.include_usage = include_usage
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.error: StreamError | None = None
        self._id = f"chatcmpl-{request_id}"
        self._model = model  # the name the client asked for: every frame names it
        self._rename = False  # the upstream names another model (the client used an alias)
        self._created = 0
        self._role_sent = False

    def feed(self, chunk: StreamChunk) -> bytes:
        if self.phase is _CLOSED:
            return b""
        native = chunk.native
        if native is not None:
            format = native.format
            if format == TOKEN_FRAMES_FORMAT:  # tokens: nothing to note
                return native.data if not self._rename else self._renamed_frames(native.data)
            if format == NATIVE_FORMAT:
                events = chunk.events
                if len(events) == 1 and type(events[0]) is TextDelta and not self._rename:
                    return b"".join((b"data: ", native.data, b"\n\n"))  # a token: nothing to note
                return self._relay(events, native.data)
        frames: list[bytes] = []
        for event in chunk.events:
            if isinstance(event, UsageReport):
                self.usage = event.usage
                if self.include_usage:
                    frames.append(self._frame([], usage_out(event.usage)))
                continue
            if isinstance(event, StreamError):
                self.error = event
                self.phase = _CLOSED
                return b"".join(frames) + stream_error_frame(event.kind, event.message, event.status)
            if isinstance(event, Finish):
                self.finish_reason = event.reason
            elif isinstance(event, MessageStart):
                self._rename = event.model != self._model
            frames.append(self._encode(event))
        return b"".join(frames)

    def _relay(self, events: list[StreamEvent], data: bytes) -> bytes:
        """The upstream's own frame (its model renamed for an alias), after noting what the
        record and the stream's end need from its events; none for a usage-only frame the
        client did not ask for."""
        usage_only = bool(events)
        for event in events:
            kind = type(event)
            if kind is TextDelta:  # the usual event: nothing to note
                usage_only = False
            elif kind is UsageReport:
                self.usage = event.usage  # type: ignore[union-attr]
            elif kind is StreamError:
                self.error = event  # type: ignore[assignment]
                self.phase = _CLOSED
                return stream_error_frame(event.kind, event.message, event.status)  # type: ignore[union-attr]
            else:
                usage_only = False
                if kind is Finish:
                    self.finish_reason = event.reason  # type: ignore[union-attr]
                elif kind is MessageStart:
                    self._rename = event.model != self._model  # type: ignore[union-attr]
        if usage_only and not self.include_usage:
            return b""
        if self._rename:
            data = renamed(data, self._model)
        return b"".join((b"data: ", data, b"\n\n"))

    def _renamed_frames(self, frames: bytes) -> bytes:
        """Token frames (one `data: ` line each) with the client's model name in each."""
        model = self._model
        return b"".join([b"data: " + renamed(frame[6:], model) + _END for frame in frames.split(_END)[:-1]])

    def finish(self) -> bytes:
        if self.phase is _CLOSED:
            return b""
        self.phase = _CLOSED
        return DONE

    # --- canonical encoding ---------------------------------------------------------

    def _frame(self, choices: list[w.ChunkChoice], usage: w.OutUsage | None = None) -> bytes:
        if not self._created:
            self._created = int(time.time())
        chunk = w.ChatCompletionChunk(
            id=self._id, created=self._created, model=self._model, choices=choices, usage=usage
        )
        return b"data: " + w.encode(chunk) + b"\n\n"

    def _delta(self, delta: w.Delta, reason: str | None = None) -> bytes:
        if not self._role_sent:
            self._role_sent = True
            delta.role = "assistant"
        return self._frame([w.ChunkChoice(delta=delta, finish_reason=reason)])

    def _encode(self, event: StreamEvent) -> bytes:
        if isinstance(event, TextDelta):
            return self._delta(w.Delta(content=event.text))
        if isinstance(event, TextRun):  # only relayed as frames (TOKEN_FRAMES_FORMAT): never here in practice
            return b"".join([self._delta(w.Delta(content=text)) for text in event.texts])
        if isinstance(event, ThinkingDelta):
            return self._delta(w.Delta(reasoning=event.text))
        if isinstance(event, ToolCallStart):
            function = w.FunctionDelta(name=event.name, arguments="")
            start = w.ToolCallDelta(index=event.index, id=event.id, type="function", function=function)
            return self._delta(w.Delta(tool_calls=[start]))
        if isinstance(event, ToolArgsDelta):
            more = w.ToolCallDelta(index=event.index, function=w.FunctionDelta(arguments=event.json_fragment))
            return self._delta(w.Delta(tool_calls=[more]))
        if isinstance(event, Finish):
            return self._delta(w.Delta(), finish_reason(event.reason))
        if isinstance(event, MessageStart):
            self._id, self._created = event.id, event.created
            return self._delta(w.Delta(content=""))
        return b""
