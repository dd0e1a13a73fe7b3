"""OpenAI Chat Completions wire types, with their decoders and encoders built once.

A request is decoded once, into the members named here, with their types and bounds
checked (error paths such as `$.messages[0].content` name the offending field). Every
member not named here is dropped: only what the gateway models reaches an upstream
(`domain.sampling`, SECURITY.md). Dropping, not refusing, keeps OpenAI clients working that
send members vLLM does not know.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from adapters.inbound._shared.problem import ErrorInfo as ErrorInfo
from adapters.inbound._shared.problem import Problem as Problem
from domain import sampling as s

# --- request -------------------------------------------------------------------


class TextContent(Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class ImageUrl(Struct, kw_only=True):
    url: str
    detail: str | None = None


class ImageContent(Struct, tag="image_url", tag_field="type", kw_only=True):
    image_url: ImageUrl


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str = ""


class ToolCall(Struct, tag="function", tag_field="type", kw_only=True):
    id: str
    function: FunctionCall


class SystemMessage(Struct, tag="system", tag_field="role", kw_only=True):
    content: str | list[TextContent]
    name: str | None = None


class DeveloperMessage(Struct, tag="developer", tag_field="role", kw_only=True):
    content: str | list[TextContent]
    name: str | None = None


class UserMessage(Struct, tag="user", tag_field="role", kw_only=True):
    content: str | list[TextContent | ImageContent]
    name: str | None = None


class AssistantMessage(Struct, tag="assistant", tag_field="role", kw_only=True):
    content: str | list[TextContent] | None = None
    tool_calls: list[ToolCall] | None = None
    # vLLM reads `reasoning` on incoming turns; `reasoning_content` is its older name.
    reasoning: str | None = None
    reasoning_content: str | None = None
    name: str | None = None


class ToolMessage(Struct, tag="tool", tag_field="role", kw_only=True):
    tool_call_id: str
    content: str | list[TextContent]


WireMessage = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# A tool's JSON Schema, kept as received: its size is bounded as sent (`max_tool_schema_bytes`)
# before it is decoded. `extra` keeps the API document saying what it is (Litestar reads it).
_OBJECT_OR_NULL = {"oneOf": [{"additionalProperties": {}, "type": "object"}, {"type": "null"}]}
ToolSchema = Annotated[Raw, msgspec.Meta(extra_json_schema={"extra": _OBJECT_OR_NULL})]


class FunctionDef(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: ToolSchema | UnsetType = UNSET


class FunctionTool(Struct, tag="function", tag_field="type", kw_only=True):
    function: FunctionDef


class NamedFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, tag="function", tag_field="type", kw_only=True):
    function: NamedFunction


class StreamOptions(Struct, kw_only=True):
    include_usage: bool | None = True  # as vLLM: true when the object is present
    continuous_usage_stats: bool | None = None  # vLLM: usage in every chunk


# JSON documents a client sizes (a schema, a grammar, template variables): kept as received,
# their size bounded as sent (`max_tool_schema_bytes`) before they are decoded.
_OBJECT = {"type": "object", "additionalProperties": {}}
JsonObject = Annotated[Raw, msgspec.Meta(extra_json_schema={"extra": _OBJECT})]
JsonSchemaOrText = Annotated[Raw, msgspec.Meta(extra_json_schema={"extra": {"oneOf": [_OBJECT, {"type": "string"}]}})]
Choices = Annotated[int, msgspec.Meta(ge=1)]
ReasoningEffortParam = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ChatCompletionRequest(Struct, kw_only=True):
    """The members the gateway models; every other member is dropped (module doc)."""

    model: str
    messages: list[WireMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: s.TopK | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # OpenAI's key for requests that share a prompt prefix: the gateway's KV-cache affinity key.
    prompt_cache_key: str | None = None
    # Sequences, each bounded by the upstream's `max_choices` (`domain.sequences`).
    n: Choices | None = None
    best_of: Choices | None = None
    reasoning_effort: ReasoningEffortParam | None = None
    thinking_token_budget: Annotated[int, msgspec.Meta(ge=0)] | None = None
    logprobs: bool | None = None
    top_logprobs: s.TopLogprobs | None = None
    # The allowlisted vLLM sampling parameters (`domain.sampling`).
    min_p: s.MinP | None = None
    repetition_penalty: s.RepetitionPenalty | None = None
    seed: s.Seed | None = None
    presence_penalty: s.Penalty | None = None
    frequency_penalty: s.Penalty | None = None
    logit_bias: s.LogitBias | None = None
    response_format: JsonObject | UnsetType = UNSET
    structured_outputs: JsonObject | UnsetType = UNSET
    guided_json: JsonSchemaOrText | UnsetType = UNSET
    guided_choice: s.GuidedChoice | None = None
    guided_regex: s.GuidedRegex | None = None
    chat_template_kwargs: JsonObject | UnsetType = UNSET


REQUEST_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
OBJECT_DECODER = msgspec.json.Decoder(dict[str, Any])
SCHEMA_DECODER = msgspec.json.Decoder(dict[str, Any] | None)
TEXT_OR_OBJECT_DECODER = msgspec.json.Decoder(dict[str, Any] | str)

# --- response ------------------------------------------------------------------


class OutFunction(Struct, kw_only=True):
    name: str
    arguments: str


class OutToolCall(Struct, kw_only=True):
    id: str
    type: str = "function"
    function: OutFunction


# A non-streaming answer from an upstream that speaks this dialect is relayed byte for
# byte, so these also describe vLLM's own: members it may write as null are typed so
# (the gateway's encoder never sets them to None), and no schema forbids extra members.


class OutMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    reasoning: str | UnsetType | None = UNSET
    tool_calls: list[OutToolCall] | UnsetType | None = UNSET


class OutChoice(Struct, kw_only=True):
    index: int = 0
    message: OutMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None  # vLLM's when the client asked for them
    stop_reason: str | None = None  # vLLM: the matched stop string


class OutPromptTokensDetails(Struct, kw_only=True):
    cached_tokens: int


class OutUsage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: OutPromptTokensDetails | UnsetType | None = UNSET


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[OutChoice]
    usage: OutUsage


class FunctionDelta(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionDelta


class Delta(Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(Struct, kw_only=True):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: OutUsage | None = None


class ModelCard(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "gateway"


class ModelList(Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


# --- errors (ErrorInfo and Problem: the shape of every `/v1` dialect, _shared/problem.py) ------


class StreamErrorFrame(Struct, kw_only=True):
    error: ErrorInfo


ENCODER = msgspec.json.Encoder()
encode = ENCODER.encode
