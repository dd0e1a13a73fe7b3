"""The dialect-neutral request, response and stream events.

Every inbound dialect decodes into `ChatRequest`; every upstream adapter answers
with a `ChatResponse` or a sequence of `StreamEvent`s. Nothing here knows which
surface produced a request: `surface` is a label for logs and traces only.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from domain.sampling import Sampling

# --- content parts -------------------------------------------------------


class TextPart(Struct, tag="text", kw_only=True):
    text: str


class ImagePart(Struct, tag="image", kw_only=True):
    """An image by URL; inline images are `data:` URLs (what OpenAI-compatible servers take)."""

    url: str
    detail: str | None = None


class ToolUsePart(Struct, tag="tool_use", kw_only=True):
    """A tool call made by the assistant; `arguments` is the JSON text of the input object."""

    id: str
    name: str
    arguments: str


class ToolResultPart(Struct, tag="tool_result", kw_only=True):
    tool_use_id: str
    content: list[TextPart | ImagePart]
    is_error: bool = False


class ThinkingPart(Struct, tag="thinking", kw_only=True):
    """Reasoning text. `signature` is opaque and only ever round-tripped, never forwarded."""

    text: str
    signature: str | None = None
    redacted: bool = False


Part = TextPart | ImagePart | ToolUsePart | ToolResultPart | ThinkingPart

Role = Literal["system", "user", "assistant"]


class Message(Struct, kw_only=True):
    """One conversation turn. Tool results are parts of a user turn, in any dialect."""

    role: Role
    content: list[Part]
    name: str | None = None


# --- request -------------------------------------------------------------


class ToolSpec(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


ToolChoiceMode = Literal["auto", "none", "required", "named"]


class ToolChoice(Struct, kw_only=True):
    mode: ToolChoiceMode
    name: str | None = None
    parallel: bool | None = None


ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh"]


class ReasoningConfig(Struct, kw_only=True):
    """Whether the model should think, and how much; `None` means the upstream's default.

    `effort` is the coarse level some clients ask for instead of a token budget (the
    Responses API's `reasoning.effort`); models that take one (gpt-oss on vLLM) get it.
    """

    enabled: bool | None = None
    budget_tokens: int | None = None
    effort: ReasoningEffort | None = None


class ChatRequest(Struct, kw_only=True):
    model: str
    messages: list[Message]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stream: bool = False
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None
    user: str | None = None
    # Which requests belong together for KV-cache affinity (`domain.affinity`), when the client
    # says so (/v1 `prompt_cache_key` or `user`, /llm `metadata.user_id`); None: by prompt prefix.
    affinity_key: str | None = None
    reasoning: ReasoningConfig | None = None
    # The allowlisted vLLM sampling parameters (`domain.sampling`): nothing else a client
    # sends reaches an upstream.
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    # Sequences: `n` answers, generated from `best_of` candidates (vLLM runs max(n, best_of)
    # sequences: `domain.sequences`); the edge bounds both by the upstream's `max_choices`.
    n: int = 1
    best_of: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    parallel_tool_calls: bool | None = None  # with tools but no tool_choice to carry it
    chat_template_kwargs: dict[str, Any] | None = None  # bounded at the edge
    continuous_usage_stats: bool | None = None  # usage in every chunk of a stream
    # Continue the final assistant message instead of starting a new one (an Anthropic prefill).
    prefill: bool = False
    # Set by the gateway, never by a client: vLLM's prefix-cache salt of the request's
    # consumer (`domain.cache_salt`); None: no salt (keys off).
    cache_salt: str | None = None
    # Labels for logs and traces only; admission never reads them.
    surface: str = ""
    request_id: str = ""


# --- response ------------------------------------------------------------

FinishReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "content_filter"]


class Usage(Struct, kw_only=True):
    input_tokens: int = 0  # every prompt token, cached ones included (as OpenAI counts)
    output_tokens: int = 0
    # Of `input_tokens`, those the upstream's prefix cache served; None: it did not say.
    cached_tokens: int | None = None


class NativePayload(Struct, kw_only=True, gc=False):
    """The upstream's own bytes, tagged with its wire format, less the members its server
    writes for the gateway alone (the outbound adapter cuts them: vLLM's token ids).

    An inbound dialect whose wire format is the same may relay these bytes untouched
    (no re-encoding, and fields the canonical model does not name survive); every other
    dialect ignores them.
    """

    format: str
    data: bytes


class ChatResponse(Struct, kw_only=True):
    id: str
    model: str
    created: int
    content: list[Part]
    finish_reason: FinishReason
    stop_sequence: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    native: NativePayload | None = None


# --- stream events ---------------------------------------------------------


class MessageStart(Struct, tag="message_start", kw_only=True, gc=False):
    id: str
    model: str
    created: int


class TextDelta(Struct, tag="text_delta", kw_only=True, gc=False):
    text: str


class TextRun(Struct, tag="text_run", kw_only=True, gc=False):
    """The texts of several `TextDelta`s in a row, as one event: the token frames of one upstream
    read (`StreamChunk`). Each text is non-empty and is what one `TextDelta` would carry; one
    object for the run, not one per token (a stream's reads hold many under load)."""

    texts: list[str]


class ThinkingDelta(Struct, tag="thinking_delta", kw_only=True, gc=False):
    text: str


class ToolCallStart(Struct, tag="tool_call_start", kw_only=True, gc=False):
    """A new tool call; `index` is the call's position among this message's calls."""

    index: int
    id: str
    name: str


class ToolArgsDelta(Struct, tag="tool_args_delta", kw_only=True, gc=False):
    index: int
    json_fragment: str


class UsageReport(Struct, tag="usage", kw_only=True, gc=False):
    """Cumulative totals; a later report replaces an earlier one."""

    usage: Usage


class Finish(Struct, tag="finish", kw_only=True, gc=False):
    reason: FinishReason
    stop_sequence: str | None = None


class StreamError(Struct, tag="error", kw_only=True, gc=False):
    """A failure after the stream started; the dialect renders it as its error event."""

    kind: str
    message: str
    status: int


StreamEvent = (
    MessageStart
    | TextDelta
    | TextRun
    | ThinkingDelta
    | ToolCallStart
    | ToolArgsDelta
    | UsageReport
    | Finish
    | StreamError
)


class StreamChunk(Struct, kw_only=True, gc=False):
    """What one upstream frame decoded to, with the frame itself, or a run of plain token
    frames of one read (their non-empty texts as one `TextRun`, or one `TextDelta` for one
    text; the frames as one `native`).

    One frame may carry several events (a finish and usage, say) or none (a keep-alive).
    `native` lets a dialect with the upstream's wire format relay the frame untouched.
    Streams deliver chunks in batches (`ChunkBatch`): the chunks decoded from one
    upstream read, which a dialect sends to its client in one write.

    `gc=False` here and on the stream events and `NativePayload` (msgspec's option): they
    hold strings, numbers and lists of events, never a reference cycle, so the cyclic GC
    need not track the few made per streamed token.
    """

    events: list[StreamEvent]
    native: NativePayload | None = None


ChunkBatch = list[StreamChunk]
"""The chunks of one upstream read, in order; empty only as a heartbeat (`ChatService.stream`)."""


class QueuePosition(Struct, tag="queue", kw_only=True):
    """Emitted by the application while a request waits for a slot; 1 = next admitted."""

    position: int
    queued: int
