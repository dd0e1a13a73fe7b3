"""Text completions (a prompt continued, or the gap before a `suffix` filled) and embeddings:
the other two operations a model server behind `/v1` serves, dialect-neutral.

They share the chat path's admission (one cap and one queue per upstream), its usage
accounting and its stream events: a text completion streams `MessageStart`,
`TextDelta`, `Finish`, `UsageReport` (or a `StreamError`) in `StreamChunk`s, each with the
upstream's own frame as `native`. Only the fields modelled here reach an upstream.

Sequences: vLLM runs every prompt's `max(n, best_of)` choices as sequences of their own,
and every embedding input as an engine request of its own (`domain.sequences`).
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from domain.canonical import FinishReason, NativePayload, Usage
from domain.sampling import Sampling


class CompletionRequest(Struct, kw_only=True):
    model: str
    prompt: list[str]  # each prompt is a sequence of its own upstream
    suffix: str | None = None  # fill-in-the-middle: the text after the gap
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    n: int = 1
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    top_k: int | None = None
    # The allowlisted vLLM sampling parameters (`domain.sampling`); nothing else reaches an upstream.
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    user: str | None = None
    stream: bool = False
    cache_salt: str | None = None  # set by the gateway per consumer, never by a client
    # Labels for logs and traces only; admission never reads them.
    surface: str = ""
    request_id: str = ""


class Completion(Struct, kw_only=True):
    """A non-streamed text completion (its first choice; `native` holds the whole answer)."""

    id: str
    model: str
    created: int
    text: str
    finish_reason: FinishReason
    usage: Usage = msgspec.field(default_factory=Usage)
    native: NativePayload | None = None


EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(Struct, kw_only=True):
    model: str
    inputs: list[str]
    dimensions: int | None = None
    encoding_format: EncodingFormat | None = None
    user: str | None = None
    cache_salt: str | None = None  # set by the gateway per consumer, never by a client
    surface: str = ""
    request_id: str = ""


class Embeddings(Struct, kw_only=True):
    """One vector per input, in input order (base64 strings when asked so)."""

    model: str
    vectors: list[list[float] | str]
    usage: Usage = msgspec.field(default_factory=Usage)  # input tokens only
    native: NativePayload | None = None
