"""Canonical text-completion chunks -> `text_completion` SSE frames, as `ChunkWriter` does for chat.

The upstream's frames (native format `openai-completion`) are relayed byte for byte (logprobs,
an `echo`ed prompt and vLLM's extra members survive), renamed when the client used an alias;
the usage-only chunk goes out only if the client asked for usage; a failure ends the stream
with vLLM's error frame and `[DONE]`, and every stream ends with `[DONE]`.
"""

from __future__ import annotations

import time

from adapters.inbound.openai import completions_schema as w
from adapters.inbound.openai.answers import FINISH_REASONS, renamed, usage_out
from adapters.inbound.openai.completions_mapping import COMPLETION_FORMAT
from adapters.inbound.openai.errors import DONE, stream_error_frame
from domain.canonical import Finish, MessageStart, StreamChunk, StreamError, TextDelta, Usage, UsageReport


class TextChunkWriter:
    """`feed` returns the bytes for one upstream chunk; `finish` returns `[DONE]` once."""

    __slots__ = ("_closed", "_created", "_id", "_model", "_rename", "error", "finish_reason", "include_usage",
                 "usage")  # fmt: skip

    def __init__(self, include_usage: bool, model: str, request_id: str) -> None:
        self.include_usage = include_usage
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.error: StreamError | None = None
        self._model = model  # the name the client asked for
        self._rename = False
        self._closed = False
        self._id = f"cmpl-{request_id}"
        self._created = 0

    def feed(self, chunk: StreamChunk) -> bytes:
        if self._closed:
            return b""
        frames: list[bytes] = []
        usage_only = bool(chunk.events)
        native = chunk.native
        relay = native is not None and native.format == COMPLETION_FORMAT
        for event in chunk.events:
            if isinstance(event, UsageReport):
                self.usage = event.usage
                if not relay and self.include_usage:
                    frames.append(self._frame(None, usage_out(event.usage)))
                continue
            usage_only = False
            if isinstance(event, StreamError):
                self.error, self._closed = event, True
                return b"".join(frames) + stream_error_frame(event.kind, event.message, event.status)
            if isinstance(event, MessageStart):
                self._rename = event.model != self._model
                self._id, self._created = event.id or self._id, event.created
            elif isinstance(event, Finish):
                self.finish_reason = event.reason
                if not relay:
                    frames.append(self._frame(w.CompletionChoice(text="", finish_reason=FINISH_REASONS.get(
                        event.reason, "stop"))))
            elif isinstance(event, TextDelta) and not relay:
                frames.append(self._frame(w.CompletionChoice(text=event.text)))
        if native is not None and relay:
            if usage_only and not self.include_usage:
                return b""
            data = renamed(native.data, self._model) if self._rename else native.data
            return b"data: " + data + b"\n\n"
        return b"".join(frames)

    def finish(self) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        return DONE

    def _frame(self, choice: w.CompletionChoice | None, usage: object = None) -> bytes:
        if not self._created:
            self._created = int(time.time())
        chunk = w.TextCompletion(id=self._id, created=self._created, model=self._model,
                                 choices=[choice] if choice is not None else [], usage=usage)  # type: ignore[arg-type]
        return b"data: " + w.encode(chunk) + b"\n\n"
