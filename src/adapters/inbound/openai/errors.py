"""Domain failures in the `/v1` shape: RFC 9457 problem documents.

Each document also carries OpenAI's `error` member, because openai-python reads
`body["error"]` for `.message`, `.type` and `.code`; without it the SDK shows only
"Error code: 503". Mid-stream failures use the frame vLLM sends, which the SDK
raises as `APIError`.
"""

from __future__ import annotations

from adapters.inbound._shared.errors import retry_after_headers
from adapters.inbound.openai import schema as w
from adapters.inbound.openai.rate_headers import rate_limit_headers
from domain.consumers import LimitKind
from domain.errors import ContextLengthExceeded, GatewayError, InvalidApiKey, RateLimited

PROBLEM_BASE = "https://api.riotpiao.com/problems/"
PROBLEM_JSON = b"application/problem+json"
DONE = b"data: [DONE]\n\n"


def error_type(status: int) -> str:
    """OpenAI's error `type` for a status: the client's fault or ours."""
    return "invalid_request_error" if status < 500 else "server_error"


def problem(error: GatewayError, request_id: str) -> w.Problem:
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
    info = w.ErrorInfo(message=error.message, type=kind, param=param, code=code)
    return w.Problem(
        type=PROBLEM_BASE + error.kind,
        title=error.title,
        status=error.status,
        detail=error.message,
        instance=f"urn:request:{request_id}",
        error=info,
    )


def stream_error_frame(kind: str, message: str, status: int) -> bytes:
    """`data: {"error": ...}` then `[DONE]`: the terminal frames of a failed stream."""
    info = w.ErrorInfo(message=message, type=error_type(status), code=kind)
    return b"data: " + w.encode(w.StreamErrorFrame(error=info)) + b"\n\n" + DONE


class ProblemRenderer:
    """The `/v1` `ErrorRenderer`."""

    __slots__ = ()

    def render(
        self, error: GatewayError, request_id: str
    ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        body = w.encode(problem(error, request_id))
        headers = retry_after_headers(error)
        if isinstance(error, RateLimited):
            headers += rate_limit_headers(error.snapshot)
        return error.status, body, PROBLEM_JSON, headers

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        return stream_error_frame(error.kind, error.message, error.status)


renderer = ProblemRenderer()
