"""Canonical text completions and embeddings -> the JSON bodies of vLLM's `/v1/completions`
and `/v1/embeddings`.

An allowlist: each body is built from the fields the canonical request models (the sampling
parameters of `domain.sampling` among them), and from nothing else a client sent; the
`cache_salt` is the gateway's own, per consumer. A stream always asks for usage (`stream_options.include_usage`),
which the gateway needs for consumer limits; whether the client sees it is the dialect's call.
"""

from __future__ import annotations

from typing import Any

import msgspec

from domain.completions import CompletionRequest, EmbeddingRequest

_ENCODER = msgspec.json.Encoder()

_OPTIONAL = ("suffix", "max_tokens", "temperature", "top_p", "top_k", "best_of", "logprobs", "user")


def encode_completion(request: CompletionRequest, token_ids: bool = False) -> bytes:
    """The upstream body; `token_ids` asks vLLM for the prompt's and the answer's token ids
    (`return_token_ids`, for a resume), as a stream (only a stream carries them)."""
    prompt = request.prompt
    body: dict[str, Any] = {"model": request.model, "prompt": prompt[0] if len(prompt) == 1 else prompt}
    for name in _OPTIONAL:
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.stop:
        body["stop"] = request.stop
    if request.n != 1:
        body["n"] = request.n
    if request.echo:
        body["echo"] = True
    for name, value in request.sampling.fields():
        body[name] = value
    if request.stream or token_ids:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if token_ids:
        body["return_token_ids"] = True
    return _ENCODER.encode(body)


def encode_embeddings(request: EmbeddingRequest) -> bytes:
    body: dict[str, Any] = {"model": request.model, "input": request.inputs}
    if request.encoding_format is not None:
        body["encoding_format"] = request.encoding_format
    if request.dimensions is not None:
        body["dimensions"] = request.dimensions
    if request.user is not None:
        body["user"] = request.user
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    return _ENCODER.encode(body)
