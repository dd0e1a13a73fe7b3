"""Canonical stream events -> Anthropic SSE frames: a pure state machine, no I/O.

The SDKs enforce the grammar strictly (`accumulate_event`): `message_start` first;
blocks appended in `content_block_start` order, so indices run 0, 1, 2 with no gaps
and no interleaving; deltas only inside their open block; `message_delta` carrying
`usage.output_tokens`; then `message_stop`. A failure ends the stream with one
`event: error` frame and nothing after it.

A tool call is held until it is complete (the next call, other content, or the finish),
then sent whole if its arguments are a JSON object (`tool_arguments`); else the stream ends
with the 502 a non-streamed answer gets, or, cut off by `max_tokens`, the call is left out
as there. Sent as they came, a client would accumulate `input=5`, or fail on its own parse.

The frames themselves, as bytes, are `frames`.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from adapters.inbound.anthropic.answers import message_id, stop_reason, tool_use_id
from adapters.inbound.anthropic.errors import error_frame
from adapters.inbound.anthropic.frames import (
    DELTA,
    END_DELTA,
    MESSAGE_STOP,
    SIGNATURE,
    START,
    STOP,
    TEXT_BLOCK,
    TEXT_DELTA,
    THINKING_BLOCK,
    THINKING_DELTA,
    message_delta,
    message_start,
    tool_use_block,
)
from adapters.inbound.anthropic.schema import ENCODER
from adapters.inbound.anthropic.tool_arguments import NOT_AN_OBJECT, object_arguments
from domain.canonical import (
    Finish,
    MessageStart,
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
from domain.errors import UpstreamProtocolError

NO_FINISH = "The upstream ended the stream without a finish reason."

_encode = ENCODER.encode


class Phase(enum.Enum):
    IDLE = "idle"  # nothing sent yet
    MESSAGE_OPEN = "message_open"  # message_start sent, no block open
    THINKING = "thinking"  # a thinking block is open
    TEXT = "text"  # a text block is open
    TOOL_USE = "tool_use"  # a tool call is being collected: its block goes out when it is complete
    FINISHED = "finished"  # finish reason seen, blocks closed: waiting for usage / the end
    DONE = "done"  # message_stop sent
    FAILED = "failed"  # error frame sent


# Bound once: an Enum member lookup costs ~60 ns on Python 3.11, and these are checked per event.
_TEXT, _DONE, _FAILED = Phase.TEXT, Phase.DONE, Phase.FAILED
_BLOCK_OPEN = frozenset({Phase.THINKING, Phase.TEXT, Phase.TOOL_USE})
_IN_MESSAGE = _BLOCK_OPEN | {Phase.MESSAGE_OPEN, Phase.FINISHED}
_DELTA_KIND = {Phase.THINKING: THINKING_DELTA, Phase.TEXT: TEXT_DELTA}


class AnthropicStream:
    """Turns one answer's canonical events into Anthropic frames.

    Tool-call arguments must arrive call after call, as vLLM and OpenAI stream them:
    a fragment for a call that is no longer the one being collected is dropped.
    """

    __slots__ = ("_args", "_call", "_called_tools", "_delta", "_id", "_index", "_model", "_reason", "_stop_sequence",
                 "_usage", "failure", "phase")  # fmt: skip

    def __init__(self, model: str) -> None:
        self.phase = Phase.IDLE
        self._model = model
        self._id: str | None = None
        self._index = -1  # the open (or last) block's index
        self._delta = b""  # the open block's delta frame prefix
        self._call: ToolCallStart | None = None  # the tool call being collected
        self._args: list[str] = []  # its argument fragments so far
        self._usage = Usage()
        self._reason: str | None = None
        self._stop_sequence: str | None = None
        self._called_tools = False
        self.failure: StreamError | None = None

    # --- state read by the controller ------------------------------------------------

    @property
    def in_message(self) -> bool:
        """message_start sent and the message not ended: pings are allowed."""
        return self.phase in _IN_MESSAGE

    @property
    def message_started(self) -> bool:
        return self._id is not None

    @property
    def blocks(self) -> int:
        """How many content blocks were started."""
        return self._index + 1

    @property
    def collecting(self) -> bool:
        """A tool call is being collected: nothing goes out until it is complete."""
        return self.phase is Phase.TOOL_USE

    @property
    def closed(self) -> bool:
        phase = self.phase
        return phase is _DONE or phase is _FAILED

    @property
    def usage(self) -> Usage:
        return self._usage

    @property
    def stop_reason(self) -> str | None:
        return self._reason

    # --- input ---------------------------------------------------------------------

    def feed(self, event: StreamEvent) -> list[bytes]:
        out: list[bytes] = []
        _HANDLERS[type(event)](self, event, out)
        return out

    def feed_many(self, events: Iterable[StreamEvent]) -> list[bytes]:
        """The frames of several events (one upstream chunk), to be sent together."""
        out: list[bytes] = []
        for event in events:
            kind = type(event)
            if kind is TextDelta and self.phase is _TEXT:  # the usual event: a text block is open
                if event.text:  # type: ignore[union-attr]
                    out.append(b"".join((self._delta, _encode(event.text), END_DELTA)))  # type: ignore[union-attr]
            else:
                _HANDLERS[kind](self, event, out)
        return out

    def finish(self) -> list[bytes]:
        """The terminal frames; idempotent. No finish reason seen is a failure, never a success."""
        out: list[bytes] = []
        if self.closed:
            return out
        if self._reason is None:
            self._on_error(StreamError(kind="upstream-protocol-error", message=NO_FINISH, status=502), out)
            return out
        out.append(message_delta(self._reason, self._stop_sequence, self._usage))
        out.append(MESSAGE_STOP)
        self.phase = Phase.DONE
        return out

    # --- handlers ------------------------------------------------------------------

    def _on_start(self, event: MessageStart, out: list[bytes]) -> None:
        if self.phase is Phase.IDLE:
            self._start_message(message_id(event.id), out)

    def _on_text(self, event: TextDelta, out: list[bytes]) -> None:
        if event.text and self._writable():
            if self.phase is not Phase.TEXT and not self._open(Phase.TEXT, TEXT_BLOCK, out):
                return
            out.append(self._delta + _encode(event.text) + END_DELTA)

    def _on_text_run(self, event: TextRun, out: list[bytes]) -> None:
        """`_on_text` for each of the run's texts (none is empty), the block opened once."""
        if self._writable():
            if self.phase is not Phase.TEXT and not self._open(Phase.TEXT, TEXT_BLOCK, out):
                return
            head = self._delta
            out += [b"".join((head, _encode(text), END_DELTA)) for text in event.texts]

    def _on_thinking(self, event: ThinkingDelta, out: list[bytes]) -> None:
        if event.text and self._writable():
            if self.phase is not Phase.THINKING and not self._open(Phase.THINKING, THINKING_BLOCK, out):
                return
            out.append(self._delta + _encode(event.text) + END_DELTA)

    def _on_tool_start(self, event: ToolCallStart, out: list[bytes]) -> None:
        """Collect the call; its block is sent when it is complete (`_settle_call`)."""
        if self._writable():
            if self.phase is Phase.IDLE:
                self._start_message(None, out)
            else:
                self._close_block(out)
                if self.phase is _FAILED:
                    return
            self._call, self._args = event, []
            self.phase = Phase.TOOL_USE

    def _on_tool_args(self, event: ToolArgsDelta, out: list[bytes]) -> None:
        call = self._call
        if event.json_fragment and call is not None and event.index == call.index:
            self._args.append(event.json_fragment)

    def _on_usage(self, event: UsageReport, out: list[bytes]) -> None:
        self._usage = event.usage

    def _on_finish(self, event: Finish, out: list[bytes]) -> None:
        if self._writable():
            if self.phase is Phase.IDLE:
                self._start_message(None, out)
            self._close_block(out, cut=event.reason == "max_tokens")
            if self.phase is _FAILED:
                return
            self._reason = stop_reason(event.reason, self._called_tools)
            self._stop_sequence = event.stop_sequence if event.reason == "stop_sequence" else None
            self.phase = Phase.FINISHED

    def _on_error(self, event: StreamError, out: list[bytes]) -> None:
        if not self.closed:
            out.append(error_frame(event.status, event.message))
            self.failure = event
            self.phase = Phase.FAILED

    # --- transitions ---------------------------------------------------------------

    def _writable(self) -> bool:
        """Content may still be added: the answer has neither finished nor failed."""
        return self.phase is not Phase.FINISHED and not self.closed

    def _start_message(self, msg_id: str | None, out: list[bytes]) -> None:
        self._id = msg_id or "msg_" + uuid.uuid4().hex
        out.append(message_start(self._id, self._model, self._usage))
        self.phase = Phase.MESSAGE_OPEN

    def _open(self, phase: Phase, block: bytes, out: list[bytes]) -> bool:
        """Open a thinking or text block; False if the tool call it ends failed the stream."""
        if self.phase is Phase.IDLE:
            self._start_message(None, out)
        else:
            self._close_block(out)
            if self.phase is _FAILED:
                return False
        self._index += 1
        out.append(START % self._index + block)
        self._delta = DELTA % self._index + _DELTA_KIND[phase]
        self.phase = phase
        return True

    def _close_block(self, out: list[bytes], cut: bool = False) -> None:
        """End the open block, or send the collected tool call (`cut`: the answer ran out of tokens)."""
        phase = self.phase
        if phase is Phase.TOOL_USE:
            self._settle_call(out, cut)
        elif phase in _BLOCK_OPEN:
            if phase is Phase.THINKING:
                out.append(SIGNATURE % self._index)  # the real API signs just before the stop
            out.append(STOP % self._index)
            self.phase = Phase.MESSAGE_OPEN

    def _settle_call(self, out: list[bytes], cut: bool) -> None:
        """The collected call as a whole tool_use block (start, its input in one delta, stop)
        if its arguments are a JSON object; else the 502 a non-streamed answer gets, or
        nothing for a call cut off by `max_tokens` (see the module doc)."""
        call, fragments = self._call, self._args
        self._call, self._args = None, []
        self.phase = Phase.MESSAGE_OPEN
        assert call is not None
        arguments = object_arguments("".join(fragments))
        if arguments is None:
            if not cut:
                error = UpstreamProtocolError
                self._on_error(StreamError(kind=error.kind, message=NOT_AN_OBJECT, status=error.status), out)
            return
        self._index += 1
        out += tool_use_block(self._index, tool_use_id(call.id), call.name, arguments)
        self._called_tools = True


_HANDLERS: dict[type, Callable[[AnthropicStream, Any, list[bytes]], None]] = {
    MessageStart: AnthropicStream._on_start,
    TextDelta: AnthropicStream._on_text,
    TextRun: AnthropicStream._on_text_run,
    ThinkingDelta: AnthropicStream._on_thinking,
    ToolCallStart: AnthropicStream._on_tool_start,
    ToolArgsDelta: AnthropicStream._on_tool_args,
    UsageReport: AnthropicStream._on_usage,
    Finish: AnthropicStream._on_finish,
    StreamError: AnthropicStream._on_error,
}
