"""vLLM chat-completions answers -> canonical: stream chunks, full responses, finish.

`StreamMapper` is fed one SSE `data` payload at a time and knows where the stream
is (`Phase`), so a stream can only end in one of two ways: a `Finish` was seen, or
a `StreamError` is produced. A stream that stops early never looks like a success.

Contract with consumers:
- Every chunk decoded from an upstream payload carries it as
  `native=NativePayload("openai-chat", payload)`, error payloads included, so an
  OpenAI-shaped surface can relay frames byte for byte. `[DONE]` is consumed, not
  relayed: the iterator just ends and the surface writes its own terminator.
- Errors the gateway detects itself (malformed JSON, missing finish, transport
  failures reported through `fail`) carry `native=None`.
- Only choice 0 produces canonical events; `native` keeps the other choices.

Most payloads of a stream are tokens that differ from each other only in the text: vLLM
writes the same id, creation time, model and field order every time. Once one has been
decoded, its bytes around the text are kept (`_head`, `_tail`), and a payload with the same
bytes around one JSON string is mapped by decoding that string alone. What the bytes around
it mean is proven once, by decoding them around a probe string (`_learn_shape`): the probe
must come out as choice 0's text and nothing else (no usage, no finish, no error). Anything
else (a payload that differs elsewhere, a text that is not one valid JSON string) takes the
full decode, which words any error.

Reads usually hold whole events (`sse_decoder.whole_events`), under load many per read:
`feed_events` maps every token event of the learnt shape (`data: ` and the same bytes) the same
way without parsing the event, and puts a run of them in one chunk whose native payload is the
run's frames as they came (`TOKEN_FRAMES_FORMAT`): an OpenAI-shaped surface relays them as one
slice, the others read the run's non-empty texts (one `TextRun`, or a `TextDelta` for one text),
the texts single payloads would give. At a GPU's pace a read holds one token event: `token_read`
maps it the same way without splitting the read.
"""

from __future__ import annotations

import enum

import msgspec

from domain.canonical import (
    ChatResponse,
    ChunkBatch,
    Finish,
    MessageStart,
    NativePayload,
    Part,
    StreamChunk,
    StreamError,
    StreamEvent,
    TextDelta,
    TextPart,
    TextRun,
    ThinkingDelta,
    ThinkingPart,
    ToolArgsDelta,
    ToolCallStart,
    ToolUsePart,
    Usage,
    UsageReport,
)
from domain.errors import GatewayError, UpstreamError, UpstreamProtocolError, UpstreamRejected

from .sse_decoder import payload_of
from .wire import (
    CHUNK_DECODER,
    COMPLETION_DECODER,
    NEXT_CHUNK_DECODER,
    STRING_DECODER,
    ChunkChoice,
    ToolCallDelta,
)

NATIVE_FORMAT = "openai-chat"
# NativePayload.data: whole SSE frames (`data: ` to the blank line) of openai-chat token payloads
TOKEN_FRAMES_FORMAT = "openai-chat-token-frames"
_DATA = b"data: "
_END = b"\n\n"  # an SSE event's end
_NEXT_DATA = b"\n\ndata: "  # an event's end and the next one's `data: ` line
_DONE = b"[DONE]"
_CONTENT_KEY = b'"content":'
_PROBE = b'"\\u0000gateway probe"'  # a JSON string no upstream text is confused with
_PROBE_TEXT = "\x00gateway probe"
_SHAPE_TRIES = 3  # token payloads a stream may learn its shape from (each costs a full decode)


def map_finish(finish_reason: str, stop_reason: str | int | None, tool_calls: bool) -> Finish | StreamError:
    """OpenAI/vLLM finish_reason (+ vLLM stop_reason) -> canonical finish.

    `length` stays `max_tokens` even after tool calls: a truncated call's arguments
    are not valid JSON, and `tool_use` would make the client run it.
    """
    if finish_reason == "length":
        return Finish(reason="max_tokens")
    if finish_reason in ("abort", "error"):
        return StreamError(
            kind=UpstreamError.kind,
            message=f"upstream ended the generation with finish_reason '{finish_reason}'",
            status=UpstreamError.status,
        )
    if finish_reason == "content_filter":
        return Finish(reason="content_filter")
    if tool_calls or finish_reason in ("tool_calls", "function_call"):
        return Finish(reason="tool_use")
    if isinstance(stop_reason, str):  # a stop string matched (an int is a stop token)
        return Finish(reason="stop_sequence", stop_sequence=stop_reason)
    return Finish(reason="end_turn")  # stop, repetition, anything unknown


def error_event(error: GatewayError) -> StreamError:
    return StreamError(kind=error.kind, message=error.message, status=error.status)


def response_from_completion(raw: bytes) -> ChatResponse:
    """A non-streaming answer body -> `ChatResponse` (thinking, text, tool calls in order)."""
    try:
        view = COMPLETION_DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise UpstreamProtocolError(f"malformed upstream response: {exc}") from None
    if view.is_error:
        raise UpstreamError(view.error_message() or "upstream reported an error")
    choice = next((c for c in view.choices if c.index == 0), None)
    if choice is None or choice.finish_reason is None:
        raise UpstreamProtocolError("upstream response has no finished choice")
    message = choice.message
    content: list[Part] = []
    thinking = message.reasoning if message.reasoning is not None else message.reasoning_content
    if thinking:
        content.append(ThinkingPart(text=thinking))
    if message.content:
        content.append(TextPart(text=message.content))
    for i, call in enumerate(message.tool_calls or ()):
        call_id = call.id or f"{view.id}-tool-{i}"
        content.append(ToolUsePart(id=call_id, name=call.function.name, arguments=call.function.arguments))
    finish = map_finish(choice.finish_reason, choice.stop_reason, bool(message.tool_calls))
    if isinstance(finish, StreamError):
        raise UpstreamError(finish.message)
    usage = Usage() if view.usage is None else view.usage.usage()
    return ChatResponse(
        id=view.id,
        model=view.model,
        created=view.created,
        content=content,
        finish_reason=finish.reason,
        stop_sequence=finish.stop_sequence,
        usage=usage,
        native=NativePayload(format=NATIVE_FORMAT, data=raw),
    )


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
    __slots__ = ("_around", "_frame_head", "_head", "_held_args", "_message_id", "_read_around", "_read_tail",
                 "_tail", "_tools", "_tries", "phase")  # fmt: skip

    def __init__(self) -> None:
        self.phase = _IDLE
        self._message_id = ""
        self._tools: set[int] = set()  # indices of tool calls already started
        self._held_args: dict[int, str] = {}  # arguments seen before their call's name
        # A token payload's bytes before and after its text (see the module doc); none yet.
        self._head: bytes | None = None
        self._frame_head: bytes | None = None  # the event's bytes before the text: `data: ` + _head
        self._tail = b""
        self._around = 0  # len(_head) + len(_tail)
        self._read_tail = b""  # a one-token read's bytes after the text: _tail + the blank line
        self._read_around = 0  # len(_frame_head) + len(_read_tail)
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
                raw = payload.removeprefix(head).removesuffix(self._tail)
                if len(raw) == len(payload) - self._around:
                    try:
                        text = STRING_DECODER.decode(raw)
                    except msgspec.DecodeError:
                        pass  # not one JSON string there: the full decode below decides
                    else:
                        return StreamChunk(events=[TextDelta(text=text)] if text else [],
                                           native=NativePayload(format=NATIVE_FORMAT, data=payload))
            try:
                view = NEXT_CHUNK_DECODER.decode(payload)
            except msgspec.DecodeError as exc:
                return self._fail(UpstreamProtocolError(f"malformed upstream stream chunk: {exc}"))
            if view.error is None and view.object != "error":
                events: list[StreamEvent] = []
                for choice in view.choices:
                    if choice.index == 0:
                        delta = choice.delta
                        if (delta is not None and choice.finish_reason is None and delta.tool_calls is None
                                and delta.reasoning is None and delta.reasoning_content is None):
                            if delta.content:
                                events.append(TextDelta(text=delta.content))
                            if self._tries:
                                self._learn_shape(payload)
                        else:
                            self._choice(choice, events)
                        break
                if view.usage is not None:
                    self._usage(view.usage.usage(), events)
                return StreamChunk(events=events, native=NativePayload(format=NATIVE_FORMAT, data=payload))
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
        native = NativePayload(format=NATIVE_FORMAT, data=payload)
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
        raw = data.removeprefix(head).removesuffix(self._read_tail)  # see `feed`
        if len(raw) != len(data) - self._read_around or 10 in raw:  # an LF: several events, no decode
            return None  # (`10 in` is a memchr; `b"\n" in` costs eight times as much)
        try:
            text = STRING_DECODER.decode(raw)
        except msgspec.DecodeError:
            return None
        # `_run_chunk` written out: a call less per token of a paced stream
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
        parts = data.split(_NEXT_DATA)
        parts[0] = parts[0][6:]  # the read's first `data: `
        parts[-1] = parts[-1][:-2]  # and its last blank line
        head = self._head if self.phase is _OPEN else None
        tail, around = self._tail, self._around
        decode = STRING_DECODER.decode
        run: list[str] | None = None  # the non-empty texts of the token events since parts[begun]
        begun = 0
        for at, part in enumerate(parts):
            if head is not None:
                raw = part.removeprefix(head).removesuffix(tail)  # see `feed`
                if len(raw) == len(part) - around:
                    try:
                        text = decode(raw)  # one JSON string: no LF in it, so one event
                    except msgspec.DecodeError:
                        pass
                    else:
                        if run is None:
                            run, begun = [], at
                        if text:
                            run.append(text)
                        continue
            if run is not None:
                batch.append(_run_chunk(run, parts[begun:at]))
                run = None
            if 10 in part:  # an LF (`10 in` is a memchr): lines or events after the `data: ` line
                blocks = (_DATA + part).split(_END)
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
            batch.append(_run_chunk(run, parts[begun:]))
        return batch

    def _learn_shape(self, payload: bytes) -> None:
        """Keep the bytes of a token payload around its text if they are proven to map any
        JSON string put between them to choice 0's text alone (see the module doc)."""
        self._tries -= 1
        key = payload.rfind(_CONTENT_KEY)
        if key <= 0 or payload[key - 1] not in b"{,":
            return
        start = key + len(_CONTENT_KEY)
        end = _string_end(payload, start)
        if end < 0:
            return
        head, tail = payload[:start], payload[end:]
        if not tail:
            return
        try:
            view = NEXT_CHUNK_DECODER.decode(b"".join((head, _PROBE, tail)))
        except msgspec.DecodeError:
            return
        if view.error is not None or view.object == "error" or view.usage is not None:
            return
        for choice in view.choices:
            if choice.index == 0:
                break
        else:
            return
        if choice.finish_reason is not None:
            return
        delta = choice.delta
        if (delta is None or delta.content != _PROBE_TEXT or delta.tool_calls is not None
                or delta.reasoning is not None or delta.reasoning_content is not None):
            return
        if 10 in head or 10 in tail or 13 in head or 13 in tail:  # LF, CR (`10 in` is a memchr: see token_read)
            return  # a payload of several `data` lines: its event's bytes are not `data: ` + payload
        self._head, self._tail, self._around = head, tail, len(head) + len(tail)
        self._frame_head = _DATA + head
        self._read_tail = tail + _END
        self._read_around = len(self._frame_head) + len(self._read_tail)

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
                for position, call in enumerate(delta.tool_calls):
                    self._tool_call(call, position, events)
        reason = choice.finish_reason
        if reason is not None and self.phase is _OPEN:
            finish = map_finish(reason, choice.stop_reason, bool(self._tools))
            events.append(finish)
            self.phase = _FAILED if isinstance(finish, StreamError) else _FINISHED

    def _tool_call(self, call: ToolCallDelta, position: int, events: list[StreamEvent]) -> None:
        index = call.index if call.index is not None else position
        function = call.function
        name = function.name if function is not None else None
        args = function.arguments if function is not None else None
        if index not in self._tools:
            if not name:  # no name yet (vLLM always sends it first; others may not)
                if args:
                    self._held_args[index] = self._held_args.get(index, "") + args
                return
            self._tools.add(index)
            call_id = call.id or f"{self._message_id}-tool-{index}"
            events.append(ToolCallStart(index=index, id=call_id, name=name))
            held = self._held_args.pop(index, "")
            if held:
                events.append(ToolArgsDelta(index=index, json_fragment=held))
        if args:
            events.append(ToolArgsDelta(index=index, json_fragment=args))


def _run_chunk(texts: list[str], payloads: list[bytes]) -> StreamChunk:
    """A run of token events: their texts (one object for them all, not a `TextDelta` each: a
    `TextDelta` for one, as `token_read` gives), their frames as they came (each token event
    is `data: `, its payload and a blank line: no other line, no CR)."""
    frames = b"".join((_DATA, _NEXT_DATA.join(payloads), _END))
    if len(texts) > 1:
        events: list[StreamEvent] = [TextRun(texts=texts)]
    else:
        events = [TextDelta(text=texts[0])] if texts else []
    return StreamChunk(events=events, native=NativePayload(format=TOKEN_FRAMES_FORMAT, data=frames))


def _string_end(data: bytes, start: int) -> int:
    """Where the JSON string literal starting at `start` ends (the index after its closing
    quote), or -1 if none starts there."""
    if data[start : start + 1] != b'"':
        return -1
    at = start + 1
    while True:
        quote = data.find(b'"', at)
        if quote < 0:
            return -1
        escapes = 0
        while data[quote - 1 - escapes] == 92:  # a backslash
            escapes += 1
        if not escapes % 2:
            return quote + 1
        at = quote + 1
