"""The Anthropic SSE frames as bytes, for the stream machine (`stream`) and the controller.

Constant frames are encoded once at import; hot-path frames (deltas, block starts and
stops) are built from the per-block byte prefixes here plus the JSON-encoded fragment.
`event: queue` is this gateway's extension, sent before `message_start` only, while a
request waits for a slot (`queue_comment` is the same news for clients that reject
unknown events).
"""

from __future__ import annotations

from adapters.inbound._shared.sse import comment_frame, event_frame
from adapters.inbound.anthropic.answers import usage_out
from adapters.inbound.anthropic.schema import ENCODER
from domain.canonical import Usage

PING = event_frame(b"ping", b'{"type":"ping"}')
KEEP_ALIVE = comment_frame()
MESSAGE_STOP = event_frame(b"message_stop", b'{"type":"message_stop"}')

# Per block: `START % index + block`, `DELTA % index + DELTA_KIND...` then the fragment and END_DELTA.
START = b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,"content_block":'
STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":'
SIGNATURE = DELTA + b'"signature_delta","signature":""}}\n\n'
INPUT = DELTA + b'"input_json_delta","partial_json":'
THINKING_DELTA = b'"thinking_delta","thinking":'
TEXT_DELTA = b'"text_delta","text":'
END_DELTA = b"}}\n\n"
THINKING_BLOCK = b'{"type":"thinking","thinking":"","signature":""}}\n\n'
TEXT_BLOCK = b'{"type":"text","text":""}}\n\n'

_encode = ENCODER.encode


def message_start(message_id: str, model: str, usage: Usage) -> bytes:
    """`message_start`: the message's id, model and input usage, no content yet."""
    message = {
        "type": "message_start",
        "message": {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_out(usage, output_tokens=0),
        },
    }
    return event_frame(b"message_start", _encode(message))


def message_delta(stop_reason: str, stop_sequence: str | None, usage: Usage) -> bytes:
    """`message_delta`: why the message ended, and its usage with `output_tokens`."""
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": usage_out(usage),
    }
    return event_frame(b"message_delta", _encode(delta))


def tool_use_block(index: int, tool_use_id: str, name: str, arguments: str) -> list[bytes]:
    """A whole `tool_use` block: its start, its input (JSON object text) as one `input_json_delta`
    (none when empty), its stop."""
    block = {"type": "tool_use", "id": tool_use_id, "name": name, "input": {}}
    out = [START % index + _encode(block) + b"}\n\n"]
    if arguments:
        out.append(INPUT % index + _encode(arguments) + END_DELTA)
    out.append(STOP % index)
    return out


def queue_frame(position: int, queued: int) -> bytes:
    """The non-standard `event: queue` frame, sent before `message_start` only."""
    return b'event: queue\ndata: {"type":"queue","position":%d,"queued":%d}\n\n' % (position, queued)


def queue_comment(position: int, queued: int) -> bytes:
    """The same news as an SSE comment, which every parser ignores (queue events turned off)."""
    return b": queued position=%d queued=%d\n\n" % (position, queued)
