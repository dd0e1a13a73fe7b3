"""The error shape of every dialect under `/v1`: RFC 9457 problem documents with an
OpenAI-style `error` member.

`/v1` holds more than one dialect package (Chat Completions, text completions and
embeddings in `openai/`, the Responses API in `responses/`), and clients of all of them
are OpenAI SDKs: they read `body["error"]` for `.message`, `.type`, `.param` and `.code`
(without it the SDK shows only "Error code: 503"). Each dialect renders a failure with
`render_problem`, so a full queue, a consumer over its limit, a refused key or a
context-length refusal look the same on every `/v1` path; only the terminal frame of a
failed stream is the dialect's own.

A problem's `type` is a URI: the failure's kind appended to the base the operator
configured (`[server] problem_base_url`, handed to the dialects in `EdgeContext`).
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from adapters.inbound._shared.errors import Headers, retry_after_headers
from adapters.inbound._shared.ratelimit_headers import rate_limit_headers
from domain.consumers import LimitKind
from domain.errors import ContextLengthExceeded, GatewayError, InvalidApiKey, RateLimited

DEFAULT_PROBLEM_BASE = "https://api.riotpiao.com/problems/"  # `[server] problem_base_url`'s default
PROBLEM_JSON = b"application/problem+json"


class ErrorInfo(Struct, kw_only=True):
    """OpenAI's error member; openai-python reads `message`, `type`, `param` and `code`."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class Problem(Struct, kw_only=True):
    """RFC 9457 problem document, with the OpenAI `error` member as an extension."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    error: ErrorInfo


_encode = msgspec.json.Encoder().encode


def error_type(status: int) -> str:
    """OpenAI's error `type` for a status: the client's fault or ours."""
    return "invalid_request_error" if status < 500 else "server_error"


def error_info(error: GatewayError) -> ErrorInfo:
    """The OpenAI `error` member for a failure: the codes OpenAI clients act on."""
    param: str | None
    if isinstance(error, ContextLengthExceeded):
        # OpenAI's own code and param: what OpenAI clients check before trimming and retrying.
        param, code = "messages", "context_length_exceeded"
    elif isinstance(error, InvalidApiKey):
        param, code = None, "invalid_api_key"  # OpenAI's code for a missing or wrong key
    else:
        param, code = getattr(error, "param", None), error.kind
    kind = error_type(error.status)
    if isinstance(error, RateLimited):  # OpenAI's code, and its type: which limit ran out
        code = "rate_limit_exceeded"
        kind = "tokens" if error.limit in (LimitKind.TOKENS_PER_MINUTE, LimitKind.TOKENS_PER_DAY) else "requests"
    return ErrorInfo(message=error.message, type=kind, param=param, code=code)


def problem(error: GatewayError, request_id: str, base: str = DEFAULT_PROBLEM_BASE) -> Problem:
    """The problem document of a failure; its `type` is `base` (ending in '/') + its kind."""
    return Problem(
        type=base + error.kind,
        title=error.title,
        status=error.status,
        detail=error.message,
        instance=f"urn:request:{request_id}",
        error=error_info(error),
    )


def render_problem(
    error: GatewayError, request_id: str, base: str = DEFAULT_PROBLEM_BASE
) -> tuple[int, bytes, bytes, Headers]:
    """(status, body, content type, extra headers): `Retry-After` on a 503 or 429, and a
    429's `x-ratelimit-*` headers. `base`: of the problem's `type` URI (`problem`)."""
    headers = retry_after_headers(error)
    if isinstance(error, RateLimited):
        headers += rate_limit_headers(error.snapshot)
    return error.status, _encode(problem(error, request_id, base)), PROBLEM_JSON, headers
