"""A non-streaming vLLM chat-completions answer -> canonical `ChatResponse`.

The answer's body, less vLLM's token-id members (`token_ids.py`), is kept as its `native`
payload (`NATIVE_FORMAT`), so an OpenAI-shaped surface can relay it byte for byte otherwise; a
stream's payloads carry the same format (`stream_mapping.py`).
"""

from __future__ import annotations

import msgspec

from domain.canonical import ChatResponse, NativePayload, Part, StreamError, TextPart, ThinkingPart, ToolUsePart, Usage
from domain.errors import UpstreamError, UpstreamProtocolError

from .finish_reasons import map_finish
from .token_ids import without_token_ids
from .wire import COMPLETION_DECODER

NATIVE_FORMAT = "openai-chat"  # NativePayload.data: a chat answer, or one stream payload, as the server wrote it
# (less vLLM's token-id members)


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
        native=NativePayload(format=NATIVE_FORMAT, data=without_token_ids(raw, view)),
    )
