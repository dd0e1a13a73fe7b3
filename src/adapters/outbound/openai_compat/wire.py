"""Read-only views of what an OpenAI-compatible server (vLLM) answers.

Only the fields the gateway acts on are declared; msgspec skips everything else
without building it, which keeps the per-chunk cost of a stream low. Unknown or
extra fields never fail a decode: relaying them is `NativePayload`'s job. vLLM's
token-id members are declared where it writes them, typed `Any` (any value decodes),
UNSET when absent: the decode counts them for their cut (`token_ids.py`).
Decoders are built once, here.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct

from domain.canonical import Usage

MAX_MESSAGE = 500  # characters of an upstream's error message a client may see


class View(Struct, kw_only=True, gc=False):
    """Base of every view: keyword-only, all fields optional with defaults.

    `gc=False` (msgspec's documented option, inherited): a view is decoded from JSON, a
    tree that never holds a reference cycle, so the cyclic GC need not track the views
    decoded per stream frame.
    """


class PromptTokensDetails(View):
    cached_tokens: int | None = None  # vLLM with --enable-prompt-tokens-details: prefix-cache hits


class UsageView(View):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    def usage(self) -> Usage:
        details = self.prompt_tokens_details
        cached = None if details is None else details.cached_tokens
        return Usage(input_tokens=self.prompt_tokens, output_tokens=self.completion_tokens, cached_tokens=cached)


class ErrorInfo(View):
    """vLLM >= 0.10.1 nests `{"error": {...}}`; `code` is the HTTP status (int)."""

    message: str | None = None
    type: str | None = None
    code: int | str | None = None


class ErrorFields(View):
    """Both vLLM error envelopes: nested `error`, or flat `{"object":"error",...}`.

    `error` may also be a bare string (some proxies); `detail` is FastAPI's default. Either
    still marks an error, but only vLLM's own shapes give a message a client may see.
    """

    error: ErrorInfo | str | None = None
    object: str | None = None
    message: str | None = None
    type: str | None = None
    code: int | str | None = None
    detail: Any = None

    @property
    def is_error(self) -> bool:
        return self.error is not None or self.object == "error"

    def error_message(self) -> str | None:
        """vLLM's message (`{"error":{"message":...}}` or `{"object":"error","message":...}`), at
        most `MAX_MESSAGE` characters; None for any other body (the caller words its own)."""
        err = self.error
        if isinstance(err, ErrorInfo) and err.message:
            return err.message[:MAX_MESSAGE]
        if self.object == "error" and self.message:
            return self.message[:MAX_MESSAGE]
        return None

    def error_code(self) -> int | None:
        """The HTTP status the upstream attached to the error, if it is one."""
        code = self.error.code if isinstance(self.error, ErrorInfo) else self.code
        if isinstance(code, str) and code.isdigit():
            code = int(code)
        return code if isinstance(code, int) and 400 <= code <= 599 else None


# --- streaming -------------------------------------------------------------------


class FunctionDelta(View):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(View):
    index: int | None = None
    id: str | None = None
    function: FunctionDelta | None = None


class Delta(View):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # vLLM <= ~0.11 name of `reasoning`
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(View):
    index: int = 0
    delta: Delta | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # vLLM: matched stop string, or stop token id
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class ChunkView(ErrorFields):
    """One `data:` payload of a chat-completions stream (or an error in its place)."""

    id: str = ""
    model: str = ""
    created: int = 0
    choices: list[ChunkChoice] = []
    usage: UsageView | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class NextChunkView(View):
    """A chat stream's payload after its first: what the gateway reads from each (choices,
    usage, whether it is an error); the id, model and creation time are the first's. An
    error is decoded again as a `ChunkView` for its message and code."""

    error: ErrorInfo | str | None = None
    object: str | None = None
    choices: list[ChunkChoice] = []
    usage: UsageView | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


# --- non-streaming ---------------------------------------------------------------


class FunctionCall(View):
    name: str = ""
    arguments: str = ""


class ToolCall(View):
    id: str = ""
    function: FunctionCall = msgspec.field(default_factory=FunctionCall)


class MessageView(View):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(View):
    index: int = 0
    message: MessageView = msgspec.field(default_factory=MessageView)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class CompletionView(ErrorFields):
    id: str = ""
    model: str = ""
    created: int = 0
    choices: list[Choice] = []
    usage: UsageView | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class TokenizeView(View):
    """A `/tokenize` answer: vLLM's `{"count": N, "max_model_len": M, "tokens": [...]}`, or
    llama.cpp's llama-server's `{"tokens": [...]}` (no `count`)."""

    count: int | None = None
    tokens: list[int] | None = None

    def size(self) -> int | None:
        """The number of tokens counted; None for an answer with neither field."""
        if self.count is not None:
            return self.count
        return None if self.tokens is None else len(self.tokens)


class TemplateView(View):
    """llama-server's `/apply-template` answer: the prompt its chat template makes."""

    prompt: str


# --- text completions and embeddings ---------------------------------------------------------


class TextChoice(View):
    index: int = 0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class TextCompletionView(ErrorFields):
    """A `text_completion` answer, or one chunk of its stream."""

    id: str = ""
    model: str = ""
    created: int = 0
    choices: list[TextChoice] = []
    usage: UsageView | None = None
    token_ids: Any = UNSET
    prompt_token_ids: Any = UNSET


class EmbeddingItem(View):
    index: int = 0
    embedding: list[float] | str = []


class EmbeddingListView(ErrorFields):
    model: str = ""
    data: list[EmbeddingItem] = []
    usage: UsageView | None = None


CHUNK_DECODER = msgspec.json.Decoder(ChunkView)
NEXT_CHUNK_DECODER = msgspec.json.Decoder(NextChunkView)
STRING_DECODER = msgspec.json.Decoder(str)  # one JSON string literal: a token's text alone
COMPLETION_DECODER = msgspec.json.Decoder(CompletionView)
ERROR_DECODER = msgspec.json.Decoder(ErrorFields)
TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeView)
TEMPLATE_DECODER = msgspec.json.Decoder(TemplateView)
TEXT_DECODER = msgspec.json.Decoder(TextCompletionView)
EMBEDDINGS_DECODER = msgspec.json.Decoder(EmbeddingListView)
