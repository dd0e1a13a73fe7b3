"""Canonical answers -> Anthropic wire: the message, the model list, the token count, and the
pieces a stream shares with them (ids, stop reasons, usage). Pure functions, no I/O.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

from adapters.inbound.anthropic import schema as w
from adapters.inbound.anthropic.tool_arguments import object_arguments, tool_input
from domain.canonical import ChatResponse, FinishReason, TextPart, ThinkingPart, ToolUsePart, Usage

_USABLE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

_STOP_REASONS: dict[FinishReason, str] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
    "content_filter": "refusal",
}


def message_id(upstream_id: str) -> str:
    """`msg_` + the upstream id's core when it is a plain token, else a random one."""
    core = upstream_id.removeprefix("chatcmpl-")
    return "msg_" + (core if _USABLE_ID.match(core) else uuid.uuid4().hex)


def tool_use_id(upstream_id: str) -> str:
    """The upstream's tool call id when Anthropic would accept it back, else `toolu_...`."""
    return upstream_id if _USABLE_ID.match(upstream_id) else "toolu_" + uuid.uuid4().hex[:24]


def stop_reason(reason: FinishReason, called_tools: bool) -> str:
    """Anthropic's stop_reason; tool calls win over a plain stop, as the API reports them."""
    if called_tools and reason == "end_turn":
        return "tool_use"
    return _STOP_REASONS[reason]


def encode_message(response: ChatResponse, model: str) -> bytes:
    """A canonical answer as an Anthropic message: thinking, then text, then tool_use blocks.

    A tool call whose arguments are not a JSON object is a 502 (`tool_arguments`), unless the
    answer ran out of tokens: then it is a call cut off mid-arguments, and it is left out
    (`stop_reason: max_tokens` says the answer is incomplete). A stream decides the same.
    """
    thinking: list[w.ContentOut] = []
    text: list[w.ContentOut] = []
    tools: list[w.ContentOut] = []
    cut = response.finish_reason == "max_tokens"
    for part in response.content:
        if isinstance(part, TextPart):
            if part.text:
                text.append(w.TextOut(text=part.text))
        elif isinstance(part, ThinkingPart):
            if part.redacted:
                thinking.append(w.RedactedThinkingOut(data=part.signature or ""))
            elif part.text:
                thinking.append(w.ThinkingOut(thinking=part.text, signature=part.signature or ""))
        elif isinstance(part, ToolUsePart):
            if cut and object_arguments(part.arguments) is None:
                continue
            call = w.ToolUseOut(id=tool_use_id(part.id), name=part.name, input=tool_input(part.arguments))
            tools.append(call)
    reason, usage = response.finish_reason, response.usage
    message = w.MessageOut(
        id=message_id(response.id),
        model=model,
        content=thinking + text + tools,
        stop_reason=stop_reason(reason, bool(tools)),
        stop_sequence=response.stop_sequence if reason == "stop_sequence" else None,
        usage=usage_out(usage),
    )
    return w.ENCODER.encode(message)


def usage_out(usage: Usage, output_tokens: int | None = None) -> w.UsageOut:
    """Anthropic's usage: `input_tokens` counts only what the cache did not serve."""
    output = usage.output_tokens if output_tokens is None else output_tokens
    cached = usage.cached_tokens
    if cached is None:
        return w.UsageOut(input_tokens=usage.input_tokens, output_tokens=output)
    cached = min(cached, usage.input_tokens)
    return w.UsageOut(input_tokens=usage.input_tokens - cached, output_tokens=output, cache_read_input_tokens=cached)


def encode_models(names: Iterable[str], created_at: str) -> bytes:
    """The Anthropic model list (one page: the gateway serves a handful of models)."""
    data = [w.ModelInfo(id=name, display_name=name, created_at=created_at) for name in names]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return w.ENCODER.encode(w.ModelList(data=data, has_more=False, first_id=first, last_id=last))


def encode_token_count(count: int) -> bytes:
    return w.ENCODER.encode(w.TokenCount(input_tokens=count))
