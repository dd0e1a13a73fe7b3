"""OpenAI Responses API wire types (`POST /v1/responses`), with their codecs built once.

A request is decoded in two steps: `RequestBody` reads the top level (its polymorphic
members `input`, `tools` and `tool_choice` as plain JSON values), then `mapping.py`
converts each input item and tool to its Struct below, so that an error names the
item (`input[3].content[0].text`) and a message item may omit its `type` (the SDKs'
"easy" input messages do). `CreateResponse` is the same request with those members
typed: what the OpenAPI document shows. Members neither names (`truncation`,
`service_tier`, `top_logprobs`, ...) are ignored, as on the other surfaces. The answers
are in `objects.py`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

# --- request: input items --------------------------------------------------------------


class InputText(Struct, tag="input_text", tag_field="type", kw_only=True):
    text: str


class OutputText(Struct, tag="output_text", tag_field="type", kw_only=True):
    """Assistant text sent back in the history."""

    text: str


class Refusal(Struct, tag="refusal", tag_field="type", kw_only=True):
    refusal: str


class InputImage(Struct, tag="input_image", tag_field="type", kw_only=True):
    image_url: str | None = None
    file_id: str | None = None  # needs the Files API: refused
    detail: str | None = None


class InputFile(Struct, tag="input_file", tag_field="type", kw_only=True):
    """Files need the Files API or a document parser: refused with a 400."""

    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class InputAudio(Struct, tag="input_audio", tag_field="type", kw_only=True):
    """Audio input: refused with a 400 (vLLM chat models here take text and images)."""

    input_audio: dict[str, Any] | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile | InputAudio
OutputPart = InputText | InputImage | InputFile  # what a function call output may hold

Role = Literal["user", "assistant", "system", "developer"]


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    role: Role
    content: str | list[ContentPart]


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    """A call the model made, sent back; `namespace` when it named a tool of a namespace."""

    call_id: str
    name: str
    arguments: str = ""
    namespace: str | None = None


class FunctionCallOutputItem(Struct, tag="function_call_output", tag_field="type", kw_only=True):
    call_id: str
    output: str | list[OutputPart]


class SummaryText(Struct, tag="summary_text", tag_field="type", kw_only=True):
    text: str


class ReasoningText(Struct, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class ReasoningPlainText(Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """Reasoning sent back by the client: its text goes back to the model as reasoning."""

    summary: list[SummaryText] = []
    content: list[ReasoningText | ReasoningPlainText] | None = None
    encrypted_content: str | None = None  # opaque, and never ours: ignored


class ItemReference(Struct, tag="item_reference", tag_field="type", kw_only=True):
    """A stored item by id: this gateway stores nothing, refused with a 400."""

    id: str


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | ItemReference

# --- request: tools ----------------------------------------------------------------------


class FunctionToolParam(Struct, tag="function", tag_field="type", kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(Struct, tag="namespace", tag_field="type", kw_only=True):
    """A named group of function tools (OpenAI's Codex CLI sends them)."""

    name: str
    description: str | None = None
    tools: list[dict[str, Any]] = []


class HostedTool(Struct, kw_only=True):
    """Tools the API's own servers would run (and `custom` tools, whose calls are free text):
    accepted and left out of what the model is offered. Any other type is treated alike;
    these are the ones the document names."""


class WebSearchTool(HostedTool, tag="web_search", tag_field="type", kw_only=True):
    pass


class WebSearchPreviewTool(HostedTool, tag="web_search_preview", tag_field="type", kw_only=True):
    pass


class FileSearchTool(HostedTool, tag="file_search", tag_field="type", kw_only=True):
    pass


class CodeInterpreterTool(HostedTool, tag="code_interpreter", tag_field="type", kw_only=True):
    pass


class ImageGenerationTool(HostedTool, tag="image_generation", tag_field="type", kw_only=True):
    pass


class McpTool(HostedTool, tag="mcp", tag_field="type", kw_only=True):
    pass


class CustomTool(HostedTool, tag="custom", tag_field="type", kw_only=True):
    pass


ToolParam = (
    FunctionToolParam | NamespaceTool | WebSearchTool | WebSearchPreviewTool | FileSearchTool | CodeInterpreterTool
    | ImageGenerationTool | McpTool | CustomTool
)


class FunctionChoice(Struct, tag="function", tag_field="type", kw_only=True):
    name: str
    namespace: str | None = None


class AllowedTool(Struct, kw_only=True):
    type: str
    name: str | None = None
    namespace: str | None = None


class AllowedToolsChoice(Struct, tag="allowed_tools", tag_field="type", kw_only=True):
    mode: Literal["auto", "required"]
    tools: list[AllowedTool]


ToolChoiceParam = Literal["auto", "none", "required"] | FunctionChoice | AllowedToolsChoice

# --- request: the top level ---------------------------------------------------------------


class ReasoningParam(Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None  # "auto", "concise", "detailed": echoed; vLLM writes no summaries


class TextFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextParam(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class _Fields(Struct, kw_only=True):
    """The members both request views share."""

    model: str
    instructions: str | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    include: list[str] | None = None  # values the gateway cannot produce are ignored
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    client_metadata: dict[str, Any] | None = None
    user: str | None = None
    stream: bool | None = None
    store: bool | None = None  # accepted and ignored: the gateway stores nothing
    # Stateful features: refused with a 400 that names them (send the whole history).
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None


class RequestBody(_Fields, kw_only=True):
    """What the handler decodes: the polymorphic members as plain JSON values."""

    input: str | list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class CreateResponse(_Fields, kw_only=True):
    """The request as the OpenAPI document shows it (typed input items and tools)."""

    input: str | list[InputItem]
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None


REQUEST_DECODER = msgspec.json.Decoder(RequestBody)
