"""A checker of the Anthropic streaming grammar, as the official SDKs enforce it.

`check_anthropic_stream` takes the raw SSE bytes (or a list of frames) of one
`/llm/v1/messages` stream and raises `GrammarError` on the first violation:
framing (`event:` line + one-line JSON `data:` whose `type` is the event name), one
`message_start` first, blocks started with indices 0, 1, 2 ... and never interleaved,
deltas only inside their open block and of that block's kind, tool input joining to a
JSON object, `message_delta` with `usage.output_tokens`, and exactly one terminal
`message_stop` or `error`. Comment lines (keep-alives) and `ping` may appear anywhere.
`event: queue` frames (the gateway's non-standard extension) are rejected unless
`allow_queue=True`, and even then only before `message_start`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
DELTA_KINDS = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
    "redacted_thinking": set(),
}


class GrammarError(AssertionError):
    pass


@dataclass(frozen=True)
class Event:
    name: str
    data: dict[str, Any]


def parse_frames(stream: bytes | str | list[bytes]) -> list[Event]:
    """The named events of an SSE byte stream; comment-only frames are skipped."""
    raw = b"".join(stream) if isinstance(stream, list) else stream
    text = raw.decode() if isinstance(raw, bytes) else raw
    if text and not text.endswith("\n\n"):
        raise GrammarError(f"stream does not end with a blank line: {text[-80:]!r}")
    events: list[Event] = []
    for frame in text.split("\n\n")[:-1]:
        lines = [line for line in frame.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            raise GrammarError(f"frame is not 'event: <name>' + one 'data: <json>' line: {frame!r}")
        name = lines[0][len("event: ") :]
        try:
            data = json.loads(lines[1][len("data: ") :])
        except ValueError as error:
            raise GrammarError(f"data of {name!r} is not JSON: {lines[1]!r}") from error
        if not isinstance(data, dict) or data.get("type") != name:
            raise GrammarError(f"data type does not equal the event name {name!r}: {data!r}")
        events.append(Event(name, data))
    return events


def _fail(i: int, event: Event, why: str) -> GrammarError:
    return GrammarError(f"event #{i} {event.name} {json.dumps(event.data)}: {why}")


def check_anthropic_stream(
    stream: bytes | str | list[bytes], *, allow_queue: bool = False, complete: bool = True
) -> list[Event]:
    """Raise `GrammarError` unless `stream` obeys the grammar; return its events (no pings/queue).

    `complete=False` accepts a prefix (no terminal event yet).
    """
    out: list[Event] = []
    started = ended = delta_seen = False
    open_index: int | None = None
    open_kind = ""
    next_index = 0
    tool_json = ""
    for i, event in enumerate(parse_frames(stream)):
        name, data = event.name, event.data
        if ended:
            raise _fail(i, event, "event after the terminal event")
        if name == "ping":
            continue
        if name == "queue":
            if not allow_queue:
                raise _fail(i, event, "queue frame (not allowed here)")
            if started:
                raise _fail(i, event, "queue frame after message_start")
            position, queued = data.get("position"), data.get("queued")
            if not (isinstance(position, int) and position >= 1 and isinstance(queued, int) and queued >= 0):
                raise _fail(i, event, "queue frame needs position >= 1 and queued >= 0")
            continue
        out.append(event)
        if name == "error":
            error = data.get("error")
            if not (
                isinstance(error, dict)
                and isinstance(error.get("type"), str)
                and isinstance(error.get("message"), str)
            ):
                raise _fail(i, event, "error needs error.type and error.message strings")
            ended = True
            continue
        if name == "message_start":
            if started:
                raise _fail(i, event, "second message_start")
            message = data.get("message") or {}
            usage = message.get("usage") or {}
            if message.get("type") != "message" or message.get("role") != "assistant":
                raise _fail(i, event, "message must be an assistant message")
            if message.get("content") != [] or not message.get("id", "").startswith("msg_"):
                raise _fail(i, event, "message needs empty content and a msg_ id")
            if not isinstance(usage.get("input_tokens"), int) or not isinstance(
                usage.get("output_tokens"), int
            ):
                raise _fail(i, event, "message_start usage needs input_tokens and output_tokens")
            started = True
            continue
        if not started:
            raise _fail(i, event, "before message_start")
        if name == "content_block_start":
            if open_index is not None:
                raise _fail(i, event, f"block {open_index} is still open")
            if delta_seen:
                raise _fail(i, event, "block after message_delta")
            if data.get("index") != next_index:
                raise _fail(i, event, f"index must be {next_index}")
            block = data.get("content_block") or {}
            open_kind = block.get("type", "")
            if open_kind not in DELTA_KINDS:
                raise _fail(i, event, "unknown block type")
            if open_kind == "tool_use" and (
                block.get("input") != {} or not block.get("id") or not block.get("name")
            ):
                raise _fail(i, event, "tool_use start needs id, name and input {}")
            open_index, next_index, tool_json = next_index, next_index + 1, ""
        elif name == "content_block_delta":
            if open_index is None or data.get("index") != open_index:
                raise _fail(i, event, f"delta outside its open block ({open_index})")
            delta = data.get("delta") or {}
            if delta.get("type") not in DELTA_KINDS[open_kind]:
                raise _fail(i, event, f"delta kind does not fit a {open_kind} block")
            if delta["type"] == "input_json_delta":
                tool_json += delta["partial_json"]
        elif name == "content_block_stop":
            if open_index is None or data.get("index") != open_index:
                raise _fail(i, event, f"stop of a block that is not open ({open_index})")
            if open_kind == "tool_use" and tool_json and not _is_object(tool_json):
                raise _fail(i, event, "tool input is not a JSON object")
            open_index = None
        elif name == "message_delta":
            if open_index is not None:
                raise _fail(i, event, f"block {open_index} is still open")
            delta = data.get("delta") or {}
            if delta.get("stop_reason") not in STOP_REASONS or "stop_sequence" not in delta:
                raise _fail(i, event, "delta needs a stop_reason and stop_sequence")
            if not isinstance((data.get("usage") or {}).get("output_tokens"), int):
                raise _fail(i, event, "usage.output_tokens is required")
            delta_seen = True
        elif name == "message_stop":
            if not delta_seen:
                raise _fail(i, event, "message_stop without message_delta")
            ended = True
        else:
            raise _fail(i, event, "unknown event")
    if complete and not ended:
        raise GrammarError("stream ended without message_stop or error")
    return out


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:  # not JSON at all
        return False
