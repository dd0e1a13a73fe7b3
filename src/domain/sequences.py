"""How many of an upstream's sequence slots one request takes (pure).

vLLM's `--max-num-seqs` counts sequences, not HTTP requests: a chat request for `n`
answers from `best_of` candidates runs `max(n, best_of)` sequences; a text completion runs
that many for each of its prompts; an embeddings request runs each input as an engine
request of its own. The gateway admits a request as that many slots of its upstream's cap
(all at once, or none), and reserves that many times its output tokens.
"""

from __future__ import annotations

from domain.canonical import ChatRequest
from domain.completions import CompletionRequest, EmbeddingRequest

DEFAULT_MAX_CHOICES = 1  # `[upstreams.NAME] max_choices`


def choices(n: int, best_of: int | None) -> int:
    """The sequences behind one prompt's answers: `n`, or `best_of` candidates if more."""
    return max(n, best_of or 1, 1)


def sequences(request: ChatRequest | CompletionRequest | EmbeddingRequest) -> int:
    """The sequence slots `request` takes (at least 1)."""
    if isinstance(request, EmbeddingRequest):
        return max(len(request.inputs), 1)
    if isinstance(request, CompletionRequest):
        return max(len(request.prompt), 1) * choices(request.n, request.best_of)
    return choices(request.n, request.best_of)
