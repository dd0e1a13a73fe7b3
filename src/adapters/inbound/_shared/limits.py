"""Input limits every dialect enforces at the edge (docs/operations.md, SECURITY.md).

Bootstrap fills them from `[server]` and `[upstreams.NAME]`; the defaults here are the
documented defaults, so a dialect built without bootstrap (tests, a third dialect)
is limited the same way. Each check is an integer comparison on something the
request path computes anyway: a violation is a 4xx rendered in the surface's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from domain.errors import InvalidRequest

# msgspec decodes recursively: JSON nested deeper than the interpreter's recursion
# budget raises RecursionError, which the dialects (and `serve`) turn into this 400.
DEEP_JSON_MESSAGE = "The request body is nested too deeply."


@dataclass(frozen=True, slots=True)
class InputLimits:
    max_header_bytes: int = 32 * 1024
    body_timeout_seconds: float | None = 30.0
    max_messages: int = 2048
    max_content_blocks: int = 512
    # model name -> the most output tokens a request for it may ask for (from its upstream)
    max_output_tokens: Mapping[str, int] = field(default_factory=dict)


def too_many_messages(count: int, limit: int, param: str = "messages") -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` has {count} messages; this gateway accepts at most {limit}.", param=param
    )


def too_many_blocks(count: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` has {count} content blocks; this gateway accepts at most {limit} per message.",
        param=param,
    )


def too_many_tokens(value: int, limit: int, model: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` is {value}; model '{model}' allows at most {limit} output tokens per request.",
        param=param,
    )


def deep_json() -> InvalidRequest:
    return InvalidRequest(DEEP_JSON_MESSAGE)
