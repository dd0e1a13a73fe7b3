"""OpenAI text completions (`POST /v1/completions`) and embeddings (`POST /v1/embeddings`)
wire types, with their decoders built once.

Only the members named here are read, and only those the canonical request models reach
the upstream: unknown members are dropped, never forwarded (SECURITY.md). The answers are vLLM's own
bytes when relayed, so they are typed as vLLM writes them (nulls allowed, no schema forbids
extra members).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from adapters.inbound.openai.schema import JsonObject, JsonSchemaOrText, OutUsage, StreamOptions
from domain import sampling as s

# --- text completions ------------------------------------------------------------------


class CompletionRequest(Struct, kw_only=True):
    model: str
    prompt: str | list[str]  # token-id prompts are refused
    suffix: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    best_of: int | None = None
    echo: bool | None = None
    logprobs: int | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    top_k: s.TopK | None = None
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


class CompletionChoice(Struct, kw_only=True):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class TextCompletion(Struct, kw_only=True):
    """A `text_completion` answer; a stream's `data:` chunks have the same shape."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: OutUsage | None = None


# --- embeddings -----------------------------------------------------------------------


class EmbeddingRequest(Struct, kw_only=True):
    model: str
    input: str | list[str]  # token-id input is refused
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


class EmbeddingData(Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, kw_only=True):
    object: str = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


COMPLETION_DECODER = msgspec.json.Decoder(CompletionRequest)
EMBEDDING_DECODER = msgspec.json.Decoder(EmbeddingRequest)
ENCODER = msgspec.json.Encoder()
encode = ENCODER.encode
