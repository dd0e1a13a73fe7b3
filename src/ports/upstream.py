"""What the core needs from a model server: chat (every dialect), text completions, embeddings."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from domain.canonical import ChatRequest, ChatResponse, ChunkBatch
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.resume import TokenTrail


class UpstreamClient(Protocol):
    """One model server (one upstream address), or one of its replicas.

    Failures are raised as `domain.errors` types. Cancelling a call aborts the
    upstream request, so the model server stops generating at once. `replica` is the
    base URL of the replica the request's admission chose (`[endpoints]`); None calls
    the upstream's own `url`.
    """

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        """Answer a non-streaming request."""
        ...

    def open_stream(
        self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None,
        trail: TokenTrail | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """Start a streaming request.

        Entering the context sends the request and checks the upstream's status, so a
        refusal is raised before anything reaches the client (for a request with a thinking
        budget, also one the server makes in its stream's first frame:
        `ThinkingBudgetRefused`); iterating yields the
        chunks of each upstream read as one batch, as they arrive; leaving the context
        closes the upstream response (an early exit aborts the generation upstream).
        With `heartbeat`, a wait of that many seconds for the next read yields an empty
        batch and the iteration goes on (the caller's cue for a keep-alive). With a `trail`
        (`domain.resume`), the server is asked for token ids, which fill it, and a break another
        replica could mend sets `trail.broken`.
        """
        ...

    def open_continuation(
        self, request: ChatRequest | CompletionRequest, trail: TokenTrail, replica: str | None = None,
        heartbeat: float | None = None, resumed_from: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """Continue `trail`'s broken answer (to `request`) on `replica`: its chunks are more of
        the same answer (no `MessageStart`; usage the whole answer's), and they fill the trail.
        `resumed_from`: the replica that broke (for the call's span)."""
        ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """Count the prompt tokens of a request; `NotSupported` if the server cannot."""
        ...


class CompletionClient(Protocol):
    """Text completions on one model server (its `/v1/completions`); failures, cancellation
    and `replica` as for `UpstreamClient`."""

    async def complete_text(self, request: CompletionRequest, replica: str | None = None) -> Completion:
        """Answer a non-streaming text completion."""
        ...

    def open_text_stream(
        self, request: CompletionRequest, replica: str | None = None, trail: TokenTrail | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """Start a streamed text completion; entering, iterating, leaving and `trail` as `open_stream`."""
        ...

    def open_continuation(
        self, request: ChatRequest | CompletionRequest, trail: TokenTrail, replica: str | None = None,
        heartbeat: float | None = None, resumed_from: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[ChunkBatch]]:
        """As `UpstreamClient.open_continuation`."""
        ...


class EmbeddingClient(Protocol):
    """Embeddings on one model server (its `/v1/embeddings`); `replica` as for `UpstreamClient`."""

    async def embed(self, request: EmbeddingRequest, replica: str | None = None) -> Embeddings:
        """One vector per input, in order."""
        ...
