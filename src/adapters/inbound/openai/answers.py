"""Canonical answers -> OpenAI wire: the `chat.completion` body, the model list, and the
pieces the streams share (finish reasons, usage, a relayed body's model name). Pure functions.
"""

from __future__ import annotations

import msgspec

from adapters.inbound.openai import schema as w
from domain.canonical import ChatResponse, FinishReason, TextPart, ThinkingPart, ToolUsePart, Usage

FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "content_filter": "content_filter",
}


def finish_reason(reason: FinishReason) -> str:
    return FINISH_REASONS.get(reason, "stop")


def usage_out(usage: Usage) -> w.OutUsage:
    cached = usage.cached_tokens
    return w.OutUsage(
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        prompt_tokens_details=msgspec.UNSET if cached is None else w.OutPromptTokensDetails(cached_tokens=cached),
    )


def renamed(native: bytes, model: str) -> bytes:
    """An upstream JSON object with its `model` replaced (re-encoded, every other member kept):
    a client that used a model alias gets its own name back, not the upstream's."""
    doc = msgspec.json.decode(native)
    if isinstance(doc, dict) and "model" in doc:
        doc["model"] = model
        return w.encode(doc)
    return native


def response_body(response: ChatResponse, model: str, native_format: str) -> bytes:
    """The `chat.completion` body naming `model` (the client's): the upstream's own bytes when
    they are in this dialect's format, else encoded from the canonical answer."""
    native = response.native
    if native is not None and native.format == native_format:
        return native.data if response.model == model else renamed(native.data, model)
    if response.model != model:
        response = msgspec.structs.replace(response, model=model)
    return encode_response(response)


def encode_response(response: ChatResponse) -> bytes:
    """A canonical answer as a `chat.completion` object."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[w.OutToolCall] = []
    for part in response.content:
        if type(part) is TextPart:
            texts.append(part.text)
        elif type(part) is ThinkingPart:
            if not part.redacted:
                thoughts.append(part.text)
        elif type(part) is ToolUsePart:
            function = w.OutFunction(name=part.name, arguments=part.arguments)
            calls.append(w.OutToolCall(id=part.id, function=function))
    message = w.OutMessage(
        content="".join(texts) if texts or not calls else None,
        reasoning="".join(thoughts) if thoughts else msgspec.UNSET,
        tool_calls=calls or msgspec.UNSET,
    )
    choice = w.OutChoice(
        message=message,
        finish_reason="tool_calls" if calls else finish_reason(response.finish_reason),
        stop_reason=response.stop_sequence,
    )
    completion = w.ChatCompletion(
        id=response.id,
        created=response.created,
        model=response.model,
        choices=[choice],
        usage=usage_out(response.usage),
    )
    return w.encode(completion)


def encode_models(models: list[str], created: int) -> bytes:
    """The OpenAI model list for the configured model names."""
    cards = [w.ModelCard(id=name, created=created) for name in models]
    return w.encode(w.ModelList(data=cards))
