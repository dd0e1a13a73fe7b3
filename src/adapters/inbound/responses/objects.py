"""The Responses API's answers: the Response object, its output items, and the stream events
(each also carries its `type` as the SSE event name), with their encoder built once.

Typed as openai-python's models require them (every required member present), so every
answer and event validates as the SDK's own type (`tests/support/responses_grammar.py`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from adapters.inbound.responses.schema import SummaryText

# --- response --------------------------------------------------------------------------


class OutputTextPart(Struct, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class ReasoningTextPart(Struct, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class OutputMessage(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    status: str
    role: str = "assistant"
    content: list[OutputTextPart]


class FunctionCallOut(Struct, tag="function_call", tag_field="type", kw_only=True, omit_defaults=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: str | UnsetType = UNSET  # set for a tool of a namespace: `name` is the tool's own


class ReasoningOut(Struct, tag="reasoning", tag_field="type", kw_only=True):
    id: str
    summary: list[SummaryText] = []
    content: list[ReasoningTextPart] = []
    status: str = "completed"


OutputItem = OutputMessage | FunctionCallOut | ReasoningOut


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseErrorInfo(Struct, kw_only=True):
    code: str
    message: str


class IncompleteDetails(Struct, kw_only=True):
    reason: str


class ReasoningEcho(Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class TextEcho(Struct, kw_only=True):
    format: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "text"})


class ResponseObject(Struct, kw_only=True):
    """A Response: what a plain request answers, and what lifecycle events carry."""

    id: str
    object: str = "response"
    created_at: int
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
    background: bool = False
    error: ResponseErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    model: str
    output: list[OutputItem] = []
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    prompt_cache_key: str | None = None
    reasoning: ReasoningEcho = msgspec.field(default_factory=ReasoningEcho)
    store: bool = False
    temperature: float | None = None
    text: TextEcho = msgspec.field(default_factory=TextEcho)
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None


# --- stream events (each also carries its `type` as the SSE event name) -----------------


class LifecycleEvent(Struct, kw_only=True):
    """`response.created`, `.queued`, `.in_progress`, `.completed`, `.incomplete`, `.failed`."""

    type: str
    sequence_number: int
    response: ResponseObject


class ItemEvent(Struct, kw_only=True):
    """`response.output_item.added` / `.done`."""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class PartEvent(Struct, kw_only=True):
    """`response.content_part.added` / `.done`."""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextPart | ReasoningTextPart


class TextDeltaEvent(Struct, kw_only=True):
    type: str = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any] = []


class TextDoneEvent(Struct, kw_only=True):
    type: str = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[Any] = []


class ReasoningDeltaEvent(Struct, kw_only=True):
    type: str = "response.reasoning_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str


class ReasoningDoneEvent(Struct, kw_only=True):
    type: str = "response.reasoning_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int = 0
    text: str


class ArgumentsDeltaEvent(Struct, kw_only=True):
    type: str = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(Struct, kw_only=True):
    type: str = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(Struct, kw_only=True):
    """`error`: a failure after the stream started (followed by `response.failed`)."""

    type: str = "error"
    sequence_number: int
    code: str
    message: str
    param: str | None = None


ENCODER = msgspec.json.Encoder()
encode = ENCODER.encode
