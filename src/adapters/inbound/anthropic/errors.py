"""Domain failures in Anthropic's error shape, as a response and as an in-stream frame.

The status is the failure's own; Anthropic's `error.type` follows from it, the way
the API pairs them. Clients pick their exception class from the status (the 2.x SDK
maps 503 to `ServiceUnavailableError`, and retries it after `Retry-After`).
"""

from __future__ import annotations

from adapters.inbound._shared.errors import retry_after_headers
from adapters.inbound._shared.sse import event_frame
from adapters.inbound.anthropic.rate_headers import rate_limit_headers
from adapters.inbound.anthropic.schema import ENCODER, ErrorBody, ErrorInfo
from domain.errors import ContextLengthExceeded, GatewayError, RateLimited

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    431: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_JSON = b"application/json"
Headers = list[tuple[bytes, bytes]]


def error_type(status: int) -> str:
    """Anthropic's `error.type` for a status; unlisted 4xx are invalid requests, 5xx api errors."""
    known = _TYPES.get(status)
    if known is not None:
        return known
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def message_of(error: GatewayError) -> str:
    """The message a client sees; a context-length refusal in the API's own words, the
    ones agent clients act on (compact the history, or lower `max_tokens`)."""
    if isinstance(error, ContextLengthExceeded):
        if error.prompt_alone_too_long:
            return f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
        return (
            "input length and `max_tokens` exceed context limit: "
            f"{error.prompt_tokens} + {error.max_tokens} > {error.limit}, "
            "decrease input length or `max_tokens` and try again"
        )
    return error.message


def error_frame(status: int, message: str) -> bytes:
    """`event: error` ending a stream whose 200 was already sent."""
    body = ErrorBody(error=ErrorInfo(type=error_type(status), message=message))
    return event_frame(b"error", ENCODER.encode(body))


class AnthropicErrors:
    """The `/llm` surface's `ErrorRenderer`."""

    __slots__ = ()

    def render(self, error: GatewayError, request_id: str) -> tuple[int, bytes, bytes, Headers]:
        info = ErrorInfo(type=error_type(error.status), message=message_of(error))
        body = ENCODER.encode(ErrorBody(error=info, request_id=request_id))
        headers = [(b"request-id", request_id.encode()), *retry_after_headers(error)]
        if isinstance(error, RateLimited):
            headers += rate_limit_headers(error.snapshot)
        return error.status, body, _JSON, headers

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        return error_frame(error.status, message_of(error))
