"""Anthropic Messages wire types (msgspec), request side and response side.

Only what the gateway maps is declared. Unknown fields (`cache_control`, `citations`,
`service_tier`, ...) are ignored, as the API ignores what a model does not use;
unknown *block* types are tagged-union misses and fail with the path of their `type`.
Decoders and encoders are built once here, never per request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from domain.sampling import MAX_TOP_K


class Wire(Struct, kw_only=True, omit_defaults=True):
    """Base of every wire type."""


# --- request: content blocks --------------------------------------------------------


class TextBlock(Wire, tag="text"):
    text: str


class Base64Source(Wire, tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(Wire, tag="url"):
    url: str


class ImageBlock(Wire, tag="image"):
    source: Base64Source | UrlSource


class ToolUseBlock(Wire, tag="tool_use"):
    id: str
    name: str
    input: msgspec.Raw  # kept as the client's JSON text: it becomes `arguments` unparsed


class ToolResultBlock(Wire, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool | None = None


class ThinkingBlock(Wire, tag="thinking"):
    thinking: str
    signature: str | None = None  # ours carry none; empty, missing and null are all fine


class RedactedThinkingBlock(Wire, tag="redacted_thinking"):
    data: str


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class MessageParam(Wire):
    # `system` turns inside `messages`: agent clients send them (the 2.x SDK typings allow
    # them); text only, and they keep their place in the conversation (docs/dialects/anthropic.md).
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


# --- request: tools, choices, options -------------------------------------------------


# A tool's JSON Schema, kept as received: its size is bounded as sent (`max_tool_schema_bytes`)
# before it is decoded. `extra` keeps the API document saying what it is (Litestar reads it).
_OBJECT_OR_NULL = {"oneOf": [{"additionalProperties": {}, "type": "object"}, {"type": "null"}]}
ToolSchema = Annotated[msgspec.Raw, Meta(extra_json_schema={"extra": _OBJECT_OR_NULL})]


class Tool(Wire):
    """A custom tool; a server tool is recognised by its versioned `type` and refused."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: ToolSchema | msgspec.UnsetType = msgspec.UNSET


class ToolChoiceAuto(Wire, tag="auto"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Wire, tag="any"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Wire, tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Wire, tag="none"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(Wire, tag="enabled"):
    budget_tokens: Annotated[int, Meta(ge=1)]


class ThinkingDisabled(Wire, tag="disabled"):
    pass


class ThinkingAdaptive(Wire, tag="adaptive"):
    pass


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive


class Metadata(Wire):
    user_id: str | None = None


class CountTokensParams(Wire):
    """The body of `messages/count_tokens`: a conversation without generation options."""

    model: str
    messages: Annotated[list[MessageParam], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesParams(CountTokensParams, kw_only=True):
    """The body of `POST /v1/messages`. Sampling fields are accepted although the 1.x/2.x
    SDK typings no longer list them (clients send them through `extra_body`)."""

    max_tokens: Annotated[int, Meta(ge=1)]
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=MAX_TOP_K)] | None = None
    metadata: Metadata | None = None


MESSAGES_DECODER = msgspec.json.Decoder(MessagesParams)
SCHEMA_DECODER = msgspec.json.Decoder(dict[str, Any] | None)  # a tool's `input_schema`
COUNT_TOKENS_DECODER = msgspec.json.Decoder(CountTokensParams)


# --- response -----------------------------------------------------------------------


class TextOut(Wire, tag="text", omit_defaults=False):
    text: str


class ThinkingOut(Wire, tag="thinking", omit_defaults=False):
    thinking: str
    signature: str = ""


class RedactedThinkingOut(Wire, tag="redacted_thinking", omit_defaults=False):
    data: str


class ToolUseOut(Wire, tag="tool_use", omit_defaults=False):
    id: str
    name: str
    input: msgspec.Raw


ContentOut = TextOut | ThinkingOut | RedactedThinkingOut | ToolUseOut


class UsageOut(Wire, omit_defaults=False):
    input_tokens: int  # the uncached rest when cache_read_input_tokens is given, as Anthropic counts
    output_tokens: int
    cache_read_input_tokens: int | msgspec.UnsetType = msgspec.UNSET  # prefix-cache hits, when reported


class MessageOut(Wire, tag="message", kw_only=True, omit_defaults=False):
    id: str
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: UsageOut


class ModelInfo(Wire, tag="model", omit_defaults=False):
    id: str
    display_name: str
    created_at: str


class ModelList(Wire, omit_defaults=False):
    data: list[ModelInfo]
    has_more: bool
    first_id: str | None
    last_id: str | None


class TokenCount(Wire, omit_defaults=False):
    input_tokens: int


class ErrorInfo(Wire, omit_defaults=False):
    type: str
    message: str


class ErrorBody(Wire, tag="error"):
    error: ErrorInfo
    request_id: str | None = None


ENCODER = msgspec.json.Encoder()
