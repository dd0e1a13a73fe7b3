"""Input limits every dialect enforces at the edge (docs/operations.md, SECURITY.md).

Bootstrap fills them from `[server]` and `[upstreams.NAME]`; the defaults here are the
documented defaults, so a dialect built without bootstrap (tests, a third dialect)
is limited the same way. Each check is an integer comparison on something the
request path computes anyway: a violation is a 4xx rendered in the surface's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from adapters.inbound._shared.media_urls import DEFAULT_SCHEMES
from domain.errors import InvalidRequest
from domain.sequences import DEFAULT_MAX_CHOICES

# msgspec decodes recursively: JSON nested deeper than the interpreter's recursion
# budget raises RecursionError, which the dialects (and `serve`) turn into this 400.
DEEP_JSON_MESSAGE = "The request body is nested too deeply."

# Fixed bounds (SECURITY.md): no real client needs more, and each is echoed into logs and
# traces (the model name) or matched against every generated token (a stop sequence).
MAX_MODEL_CHARS = 256
MAX_STOP_CHARS = 512


@dataclass(frozen=True, slots=True)
class InputLimits:
    max_header_bytes: int = 32 * 1024
    body_timeout_seconds: float | None = 30.0
    max_messages: int = 2048
    max_content_blocks: int = 512  # per list of blocks, at every level (tool_result content too)
    max_stop_sequences: int = 16
    max_tools: int = 256
    max_tool_schema_bytes: int = 65536  # one tool's JSON schema, as received
    media_url_schemes: frozenset[str] = DEFAULT_SCHEMES
    # model name -> the most output tokens a request for it may ask for (from its upstream)
    max_output_tokens: Mapping[str, int] = field(default_factory=dict)
    # model name -> the most choices (`n`, `best_of`) a request for it may ask for; absent: 1
    max_choices: Mapping[str, int] = field(default_factory=dict)

    def choices_for(self, model: str) -> int:
        return self.max_choices.get(model, DEFAULT_MAX_CHOICES)


def too_many_messages(count: int, limit: int, param: str = "messages") -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` has {count} messages; this gateway accepts at most {limit}.", param=param
    )


def too_many_blocks(count: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` has {count} content blocks; this gateway accepts at most {limit} in one list of blocks.",
        param=param,
    )


def too_many_tokens(value: int, limit: int, model: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` is {value}; model '{model}' allows at most {limit} output tokens per request.",
        param=param,
    )


def check_model(model: str, param: str = "model") -> None:
    """Before anything routes on it: the name is also logged and traced."""
    if len(model) > MAX_MODEL_CHARS:
        raise InvalidRequest(
            f"`{param}` is {len(model)} characters long; this gateway accepts model names of at most "
            f"{MAX_MODEL_CHARS}.",
            param=param,
        )


def check_stop(stops: Sequence[str], limit: int, param: str, item: Callable[[int], str]) -> None:
    """At most `limit` stop sequences of at most MAX_STOP_CHARS each; `item(i)` names the i-th."""
    if len(stops) > limit:
        raise InvalidRequest(
            f"`{param}` has {len(stops)} stop sequences; this gateway accepts at most {limit}.", param=param
        )
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_CHARS:
            where = item(i)
            raise InvalidRequest(
                f"`{where}` is {len(stop)} characters long; this gateway accepts stop sequences of at most "
                f"{MAX_STOP_CHARS}.",
                param=where,
            )


def too_many_tools(count: int, limit: int, param: str = "tools") -> InvalidRequest:
    return InvalidRequest(f"`{param}` has {count} tools; this gateway accepts at most {limit}.", param=param)


def tool_schema_too_large(size: int, limit: int, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{param}` is {size} bytes; this gateway accepts tool schemas of at most {limit} bytes.", param=param
    )


def check_choices(param: str, value: int | None, limit: int, model: str) -> None:
    """`n` / `best_of`: at least 1, at most the upstream's `max_choices`."""
    if value is None:
        return
    if value < 1:
        raise InvalidRequest(f"`{param}` must be at least 1.", param=param)
    if value > limit:
        raise InvalidRequest(
            f"`{param}` is {value}; model '{model}' runs at most {limit} "
            f"{'sequence' if limit == 1 else 'sequences'} per request on this gateway (max_choices).",
            param=param,
        )


def check_raw_size(raw: bytes, limit: int, param: str) -> None:
    """A JSON document a client sized (a schema, a grammar), bounded as received."""
    if len(raw) > limit:
        raise InvalidRequest(f"`{param}` is {len(raw)} bytes; this gateway accepts at most {limit}.", param=param)


def deep_json() -> InvalidRequest:
    return InvalidRequest(DEEP_JSON_MESSAGE)
