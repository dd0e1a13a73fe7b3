"""Token estimates for consumer limits (pure): before a request runs, and for upstreams
that send no usage.

Limits are charged in tokens, but the gateway has no tokenizer: before admission it
reserves an estimate (`reservation_tokens`: about four characters a token for the prompt,
plus the most the answer may take), and at the end the upstream's own `usage` replaces
it. An upstream that reports no usage in its stream (llama.cpp's server ignores
`include_usage`) is charged by `UsageMeter`: the streamed deltas counted as one token
each, and the prompt estimate; never 0.
"""

from __future__ import annotations

import math

from domain.canonical import (
    ChatRequest,
    ImagePart,
    Part,
    StreamChunk,
    TextDelta,
    TextPart,
    TextRun,
    ThinkingDelta,
    ThinkingPart,
    ToolArgsDelta,
    ToolResultPart,
    ToolUsePart,
    Usage,
    UsageReport,
)
from domain.completions import CompletionRequest, EmbeddingRequest
from domain.sequences import sequences

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4  # role markers and separators of a chat template
TOKENS_PER_IMAGE = 765  # what OpenAI charges a 512x512 tile image; a fair middle for vision models


Estimable = ChatRequest | CompletionRequest | EmbeddingRequest
_TEXT = (TextPart, ThinkingPart)  # a tuple made once: `A | B` in a loop makes a union per part


def prompt_tokens(request: Estimable) -> int:
    """A rough upper-leaning estimate of the prompt's tokens (text / 4, per-message overhead)."""
    if isinstance(request, CompletionRequest):
        chars = sum(len(p) for p in request.prompt) + len(request.suffix or "")
        return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(request.prompt)
    if isinstance(request, EmbeddingRequest):
        return math.ceil(sum(len(text) for text in request.inputs) / CHARS_PER_TOKEN) + len(request.inputs)
    chars = 0
    images = 0
    for message in request.messages:
        for part in message.content:
            if isinstance(part, _TEXT):
                chars += len(part.text)
            elif isinstance(part, ToolUsePart):
                chars += len(part.name) + len(part.arguments)
            elif isinstance(part, ToolResultPart):
                for inner in part.content:
                    if isinstance(inner, TextPart):
                        chars += len(inner.text)
                    else:
                        images += 1
            elif isinstance(part, ImagePart):
                images += 1
    for tool in request.tools:
        chars += len(tool.name) + len(tool.description or "") + len(repr(tool.parameters))
    return (math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(request.messages)
            + TOKENS_PER_IMAGE * images)


def reservation_tokens(request: Estimable, prompt_estimate: int | None = None) -> int:
    """What a request reserves before it runs: its prompt estimate plus its output budget
    (`max_tokens`, which the edge has already capped at the upstream's `max_output_tokens`)
    once per sequence it runs (`domain.sequences`: n / best_of choices, each prompt's);
    an embedding has no output. `prompt_estimate`: `prompt_tokens(request)` if already known."""
    prompt = prompt_tokens(request) if prompt_estimate is None else prompt_estimate
    if isinstance(request, EmbeddingRequest):
        return prompt
    return prompt + (request.max_tokens or 0) * sequences(request)


class UsageMeter:
    """Watches a stream's events: the upstream's usage if it reports one, else an estimate."""

    __slots__ = ("_deltas", "_prompt", "_request", "reported")

    def __init__(self, request: Estimable) -> None:
        self._request = request
        self._prompt: int | None = None
        self._deltas = 0
        self.reported: Usage | None = None

    @property
    def prompt(self) -> int:
        """The prompt's estimate, counted when first asked for: most requests never need it
        (no token limits, and the upstream reports its usage)."""
        prompt = self._prompt
        if prompt is None:
            prompt = self._prompt = prompt_tokens(self._request)
        return prompt

    def feed_batch(self, batch: list[StreamChunk]) -> None:
        """The chunks of one upstream read: deltas counted, the upstream's usage kept."""
        for chunk in batch:
            for event in chunk.events:
                kind = type(event)
                if kind is TextDelta or kind is ThinkingDelta or kind is ToolArgsDelta:
                    self._deltas += 1
                elif kind is TextRun:
                    self._deltas += len(event.texts)  # type: ignore[union-attr]
                elif kind is UsageReport:
                    self.reported = event.usage  # type: ignore[union-attr]

    def feed_answer(self, content: list[Part]) -> None:
        """A whole (non-streamed) answer: its text at about four characters a token."""
        chars = 0
        for part in content:
            if isinstance(part, _TEXT):
                chars += len(part.text)
            elif isinstance(part, ToolUsePart):
                chars += len(part.name) + len(part.arguments)
        self._deltas += math.ceil(chars / CHARS_PER_TOKEN)

    def usage(self) -> Usage:
        """The reported usage, or the estimate: the prompt estimate and one token per delta."""
        if self.reported is not None:
            return self.reported
        return Usage(input_tokens=self.prompt, output_tokens=self._deltas)

    @property
    def total(self) -> int:
        usage = self.usage()
        return usage.input_tokens + usage.output_tokens
