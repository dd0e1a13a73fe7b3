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
    return ContextLengthExceeded(message, prompt_tokens=prompt, max_tokens=output, limit=limit_tokens)


def upstream_rejection(status: int, message: str) -> UpstreamRejected:
    """The domain error for an upstream 4xx: a context-length refusal, or the 4xx as it is."""
    if status == 400:
        parsed = parse_context_length(message)
        if parsed is not None:
            return parsed
        if refuses_budget(message):
            return ThinkingBudgetRefused(message)
    return UpstreamRejected(status, message)
