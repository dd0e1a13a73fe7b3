"""vLLM chat-completions stream -> canonical chunks.

`StreamMapper` is fed one SSE `data` payload at a time and knows where the stream is
(`Phase`), so a stream can only end in one of two ways: a `Finish` was seen, or a
`StreamError` is produced. A stream that stops early never looks like a success.

Contract with consumers:
- Every chunk decoded from an upstream payload carries it, less vLLM's token-id members
  (`token_ids.py`), as `native=NativePayload("openai-chat", payload)`, error payloads included,
  so an OpenAI-shaped surface can relay frames byte for byte. `[DONE]` is consumed, not
  relayed: the iterator just ends and the surface writes its own terminator.
- Errors the gateway detects itself (malformed JSON, missing finish, transport failures
  reported through `fail`) carry `native=None`. Only choice 0 produces canonical events;
  `native` keeps the other choices.

Once a token payload's shape is learnt (`token_frames.py`), a payload of that shape is mapped
by decoding its text alone, and relayed as that text between the learnt bytes less those
members (cut once, when learnt). Reads usually hold whole events (`sse_decoder.whole_events`),
under load many per read: `feed_events` maps every token event of the learnt shape the same way
without parsing the event, and puts a run of them in one chunk (`token_frames.run_chunk`). At
a GPU's pace a read holds one token event: `token_read` maps it without splitting the read.
"""

from __future__ import annotations

import enum

import msgspec

from domain.canonical import (
    ChunkBatch,
    MessageStart,
    NativePayload,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    Usage,
    UsageReport,
)
from domain.errors import GatewayError, UpstreamError, UpstreamProtocolError, UpstreamRejected

from .chat_response import NATIVE_FORMAT
from .finish_reasons import error_event, map_finish
from .sse_decoder import payload_of
from .token_frames import DATA, EVENT_END, NEXT_DATA, TOKEN_FRAMES_FORMAT, run_chunk, token_shape
from .token_ids import cut_tail, without_token_ids
from .tool_call_deltas import ToolCallDeltas
from .wire import CHUNK_DECODER, NEXT_CHUNK_DECODER, STRING_DECODER, ChunkChoice, NextChunkView

_DONE = b"[DONE]"
_SHAPE_TRIES = 3  # token payloads a stream may learn its shape from (each costs a full decode)


class Phase(enum.Enum):
    IDLE = "idle"  # nothing received
    OPEN = "open"  # MessageStart emitted, no finish yet
    FINISHED = "finished"  # choice 0 finished; usage and [DONE] may follow
    DONE = "done"  # [DONE] received
    FAILED = "failed"  # a StreamError was emitted; nothing more is produced


# Bound once: reading an Enum member off its class costs about 60 ns on Python 3.11, and the
# phase is checked on every payload.
_IDLE, _OPEN, _FINISHED, _ENDED_DONE, _FAILED = Phase.IDLE, Phase.OPEN, Phase.FINISHED, Phase.DONE, Phase.FAILED


class StreamMapper:
    __slots__ = ("_around", "_frame_head", "_head", "_message_id", "_out", "_read_around", "_read_tail", "_relay",
                 "_tail", "_tools", "_tries", "phase")  # fmt: skip

    def __init__(self) -> None:
        self.phase = _IDLE
        self._message_id = ""
        self._tools: ToolCallDeltas | None = None  # made by the first tool call delta
        # A token payload's bytes before and after its text (`token_frames.py`); none yet.
        self._head: bytes | None = None
        self._frame_head: bytes | None = None  # the event's bytes before the text: `data: ` + _head
        self._tail = b""
        self._around = 0  # len(_head) + len(_tail)
        self._read_tail = b""  # a one-token read's bytes after the text: _tail + the blank line
        self._read_around = 0  # len(_frame_head) + len(_read_tail)
        self._out: bytes | None = None  # _tail without token-id members, if it had some (`token_ids.py`)
        self._relay = (b"", b"", b"")  # what a run relays before, between and after its texts (`run_chunk`)
        self._tries = _SHAPE_TRIES

    @property
    def ended(self) -> bool:
        """True once nothing more will be produced ([DONE] or an error)."""
        phase = self.phase
        return phase is _ENDED_DONE or phase is _FAILED

    def feed(self, payload: bytes) -> StreamChunk | None:
        """The chunk one `data` payload maps to; None for `[DONE]`, empties, or after the end."""
        phase = self.phase
        if phase is _OPEN and payload and payload != _DONE:  # the usual payload: a token
            head = self._head
            if head is not None:
                # The text alone if the bytes around it are the learnt ones: both removed, one
                # length tells (`startswith` and `endswith` parse their arguments the slow way).
                body = payload.removesuffix(self._tail)
                raw = body.removeprefix(head)
                if len(raw) == len(payload) - self._around:
                    try:
                        text = STRING_DECODER.decode(raw)
                    except msgspec.DecodeError:
                        pass  # not one JSON string there: the full decode below decides
                    else:
                        if self._out is not None:  # relayed without its token ids
                            payload = body + self._out
                        return StreamChunk(events=[TextDelta(text=text)] if text else [],
                                           native=NativePayload(format=NATIVE_FORMAT, data=payload))
            try:
                view = NEXT_CHUNK_DECODER.decode(payload)
            except msgspec.DecodeError as exc:
                return self._fail(UpstreamProtocolError(f"malformed upstream stream chunk: {exc}"))
            if view.error is None and view.object != "error":
                events: list[StreamEvent] = []
                relayed = None  # the payload as relayed, once a shape is learnt from it
                for choice in view.choices:
                    if choice.index == 0:
                        delta = choice.delta
                        if (delta is not None and choice.finish_reason is None and delta.tool_calls is None
                                and delta.reasoning is None and delta.reasoning_content is None):
                            if delta.content:
                                events.append(TextDelta(text=delta.content))
                            if self._tries:
                                relayed = self._learn_shape(payload, view)
                        else:
                            self._choice(choice, events)
                        break
                if view.usage is not None:
                    self._usage(view.usage.usage(), events)
                return StreamChunk(events=events, native=NativePayload(
                    format=NATIVE_FORMAT, data=relayed or without_token_ids(payload, view)))
        elif phase is _ENDED_DONE or phase is _FAILED or not payload:
            return None
        if payload == _DONE:
            if phase is _FINISHED:
                self.phase = _ENDED_DONE
                return None
            return self._fail(UpstreamProtocolError("upstream stream ended without a finish_reason"))
        try:
            full = CHUNK_DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            return self._fail(UpstreamProtocolError(f"malformed upstream stream chunk: {exc}"))
        native = NativePayload(format=NATIVE_FORMAT, data=without_token_ids(payload, full))
        if full.is_error:
            status = full.error_code() or UpstreamError.status
            kind = UpstreamRejected.kind if status < 500 else UpstreamError.kind
            message = full.error_message() or "upstream reported an error mid-stream"
            self.phase = _FAILED
            return StreamChunk(events=[StreamError(kind=kind, message=message, status=status)], native=native)
        events = []
        if phase is _IDLE:
            self.phase = _OPEN
            self._message_id = full.id
            events.append(MessageStart(id=full.id, model=full.model, created=full.created))
        for choice in full.choices:
            if choice.index == 0:
                self._choice(choice, events)
                break
        if full.usage is not None:
            self._usage(full.usage.usage(), events)
        return StreamChunk(events=events, native=native)

    def token_read(self, data: bytes) -> ChunkBatch | None:
        """A read that is one token event of the learnt shape, mapped as `feed_events` maps it
        (one run of one frame), without splitting the read; None for any other read. Paced
        streams read one token at a time. Only for a read with nothing pending before it: its
        text is one JSON string (no LF, no CR in it) between bytes with none, so the read holds
        exactly one whole event."""
        if self.phase is not _OPEN:
            return None
        head = self._frame_head
        if head is None:
            return None
        body = data.removesuffix(self._read_tail)
        raw = body.removeprefix(head)  # see `feed`
        if len(raw) != len(data) - self._read_around or 10 in raw:  # an LF: several events, no decode
            return None  # (`10 in` is a memchr; `b"\n" in` costs eight times as much)
        try:
            text = STRING_DECODER.decode(raw)
        except msgspec.DecodeError:
            return None
        if self._out is not None:  # relayed without its token ids
            data = body + self._relay[2]
        # `run_chunk` written out: a call less per token of a paced stream
        return [StreamChunk(events=[TextDelta(text=text)] if text else [],
                            native=NativePayload(format=TOKEN_FRAMES_FORMAT, data=data))]

    def feed_events(self, data: bytes) -> ChunkBatch:
        """The chunks of a read of whole events (`sse_decoder.whole_events`), up to a failure:
        token events of the learnt shape in runs (the module doc), every other event as `feed`
        maps its payload. The read is cut at each `\n\ndata: ` (one split: a longer needle is
        found faster than the blank line alone): a part is what follows an event's `data: `, up
        to the next event that starts with one; a part with an LF holds more lines or events,
        read block by block."""
        batch: ChunkBatch = []
        parts = data.split(NEXT_DATA)
        parts[0] = parts[0][6:]  # the read's first `data: `
        parts[-1] = parts[-1][:-2]  # and its last blank line
        head = self._head if self.phase is _OPEN else None
        tail, around = self._tail, self._around
        decode = STRING_DECODER.decode
        run: list[str] | None = None  # the non-empty texts of a run of token events
        raws: list[bytes] = []  # the run's texts as JSON strings, every one
        for part in parts:
            if head is not None:
                raw = part.removeprefix(head).removesuffix(tail)  # see `feed`
                if len(raw) == len(part) - around:
                    try:
                        text = decode(raw)  # one JSON string: no LF in it, so one event
                    except msgspec.DecodeError:
                        pass
                    else:
                        if run is None:
                            run, raws = [], []
                        raws.append(raw)
                        if text:
                            run.append(text)
                        continue
            if run is not None:
                batch.append(run_chunk(run, raws, self._relay))
                run = None
            if 10 in part:  # an LF (`10 in` is a memchr): lines or events after the `data: ` line
                blocks = (DATA + part).split(EVENT_END)
                payloads = [payload for block in blocks if (payload := payload_of(block)) is not None]
            else:
                payloads = [part]
            for payload in payloads:
                chunk = self.feed(payload)
                if chunk is not None:
                    batch.append(chunk)
                    if self.phase is _FAILED:
                        return batch
            # `feed` may have learnt the shape or ended the answer
            head = self._head if self.phase is _OPEN else None
            tail, around = self._tail, self._around
        if run is not None:
            batch.append(run_chunk(run, raws, self._relay))
        return batch

    def _learn_shape(self, payload: bytes, view: NextChunkView) -> bytes | None:
        """Keep the bytes around a token payload's text (`token_frames.token_shape`) if its
        token-id members, if any, can be cut from them; the payload as relayed if so."""
        self._tries -= 1
        shape = token_shape(payload)
        out = None if shape is None else cut_tail(shape[1], view)  # the tail as relayed
        if shape is None or out is None:
            return None
        head, tail = shape
        self._out = None if out == tail else out
        self._relay = (DATA + head, out + NEXT_DATA + head, out + EVENT_END)
        self._head, self._tail, self._around = head, tail, len(head) + len(tail)
        self._frame_head, self._read_tail = DATA + head, tail + EVENT_END
        self._read_around = len(self._frame_head) + len(self._read_tail)
        return payload if self._out is None else payload[: len(payload) - len(tail)] + out

    def _usage(self, usage: Usage, events: list[StreamEvent]) -> None:
        # An error stays the last event; usage still counts what was generated.
        at = len(events) - 1 if self.phase is _FAILED else len(events)
        events.insert(at, UsageReport(usage=usage))

    def close(self) -> StreamChunk | None:
        """End of the byte stream: an error chunk unless the stream had finished."""
        if self.ended or self.phase is _FINISHED:
            return None
        return self._fail(UpstreamProtocolError("upstream stream ended without a finish_reason"))

    def fail(self, error: GatewayError) -> StreamChunk | None:
        """A transport failure mid-stream; ignored once choice 0 has finished."""
        if self.ended or self.phase is _FINISHED:
            return None
        return self._fail(error)

    def _fail(self, error: GatewayError) -> StreamChunk:
        self.phase = _FAILED
        return StreamChunk(events=[error_event(error)])

    def _choice(self, choice: ChunkChoice, events: list[StreamEvent]) -> None:
        delta = choice.delta
        if delta is not None:
            thinking = delta.reasoning if delta.reasoning is not None else delta.reasoning_content
            if thinking:
                events.append(ThinkingDelta(text=thinking))
            if delta.content:
                events.append(TextDelta(text=delta.content))
            if delta.tool_calls:
                tools = self._tools
                if tools is None:
                    tools = self._tools = ToolCallDeltas(self._message_id)
                for position, call in enumerate(delta.tool_calls):
                    tools.add(call, position, events)
        reason = choice.finish_reason
        if reason is not None and self.phase is _OPEN:
            finish = map_finish(reason, choice.stop_reason, bool(self._tools))  # a call has started
            events.append(finish)
            self.phase = _FAILED if isinstance(finish, StreamError) else _FINISHED
