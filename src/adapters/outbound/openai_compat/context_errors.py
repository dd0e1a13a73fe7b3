"""vLLM's context-length 400s -> `ContextLengthExceeded` (pure: text in, domain error out).

vLLM has worded this refusal differently across versions; each number is read with
its own small pattern, so a reworded sentence around the numbers still parses:

- 0.4-0.6: "This model's maximum context length is 8192 tokens. However, you requested
  9000 tokens (8000 in the messages, 1000 in the completion). Please reduce ..."
  and, without max_tokens, "... However, you requested 8200 tokens in the messages, ..."
- 0.7-0.10: "This model's maximum context length is 4096 tokens. However, your request has
  4176 input tokens. Please reduce the length of the input messages."
  and "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum
  context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778)."
- 0.11 and later: "This model's maximum context length is 32768 tokens. However, you requested
  32000 output tokens and your prompt contains at least 769 input tokens, for a total of
  at least 32769 tokens. ..."
- the V1 engine's own check: "The decoder prompt (length 9000) is longer than the maximum
  model length of 8192. ..."

A 400 without a limit and a prompt size in it is not a context-length error: it passes
through unchanged as `UpstreamRejected`, unless it is vLLM's refusal of a thinking budget
(`reasoning_refusal`), which the application may answer by sending the request again without it.

A prompt size is a lower bound, not the prompt's size, when vLLM says "at least N input
tokens": it stops tokenizing a prompt once it is over the limit (0.32: at max-model-len + 1,
whatever the prompt's real size). A size of exactly limit + 1 is taken as such a bound too,
whatever the wording. The client then asks the server's `/tokenize` for the real size
(`with_prompt_count`), so a client that trims by the difference trims enough.
"""

from __future__ import annotations

import re

from domain.errors import ContextLengthExceeded, ThinkingBudgetRefused, UpstreamRejected

from .reasoning_refusal import refuses_budget

_LIMIT = re.compile(r"maximum (?:context|model) length (?:is|of) (\d+)", re.IGNORECASE)
_PROMPT = (
    re.compile(r"(\d+)(?: tokens)? in the (?:messages|prompt|input)\b", re.IGNORECASE),
    re.compile(r"(\d+) (?:input|prompt) tokens\b", re.IGNORECASE),
    re.compile(r"prompt \(length (\d+)\)", re.IGNORECASE),
)
_AT_LEAST = re.compile(r"at least (\d+) (?:input|prompt) tokens\b", re.IGNORECASE)
_OUTPUT = (
    re.compile(r"(\d+) in the completion", re.IGNORECASE),
    re.compile(r"(\d+) output tokens\b", re.IGNORECASE),
    re.compile(r"'max_tokens'(?: or 'max_completion_tokens')? is too large: (\d+)", re.IGNORECASE),
)


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        found = pattern.search(text)
        if found is not None:
            return int(found.group(1))
    return None


def parse_context_length(message: str) -> ContextLengthExceeded | None:
    """The domain error for a context-length refusal worded by vLLM, else None."""
    limit = _LIMIT.search(message)
    if limit is None:
        return None
    prompt = _first(_PROMPT, message)
    if prompt is None:
        return None
    output = _first(_OUTPUT, message)
    limit_tokens = int(limit.group(1))
    if output is None and prompt < limit_tokens:
        return None  # numbers that do not explain the refusal: better passed through as they are
    exact = _AT_LEAST.search(message) is None and prompt != limit_tokens + 1
    return ContextLengthExceeded(message, prompt_tokens=prompt, max_tokens=output, limit=limit_tokens, exact=exact)


def exact_message(prompt: int, output: int | None, limit: int) -> str:
    """A context-length refusal worded as vLLM words one whose prompt it counted to the end
    (so it reads like any other upstream refusal, and parses back to the same numbers)."""
    if output is None:
        return (
            f"This model's maximum context length is {limit} tokens. However, your request has {prompt} "
            "input tokens. Please reduce the length of the input messages."
        )
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested {output} output tokens "
        f"and your prompt contains {prompt} input tokens, for a total of {prompt + output} tokens. Please reduce "
        "the length of the input prompt or the number of requested output tokens."
    )


def with_prompt_count(error: ContextLengthExceeded, count: int) -> ContextLengthExceeded:
    """The refusal with the prompt's size as the server's tokenizer counted it, and a message
    that says so; the refusal as it was when the count is below its bound (a tokenizer that
    disagrees with the refusal's own count is not believed over it)."""
    if count < error.prompt_tokens:
        return error
    counted = ContextLengthExceeded(
        exact_message(count, error.max_tokens, error.limit),
        prompt_tokens=count, max_tokens=error.max_tokens, limit=error.limit,
    )  # fmt: skip
    counted.failure = error.failure
    return counted


def upstream_rejection(status: int, message: str) -> UpstreamRejected:
    """The domain error for an upstream 4xx: a context-length refusal, or the 4xx as it is."""
    if status == 400:
        parsed = parse_context_length(message)
        if parsed is not None:
            return parsed
        if refuses_budget(message):
            return ThinkingBudgetRefused(message)
    return UpstreamRejected(status, message)
