"""Dialect-neutral failures.

Each failure is raised once, where it happens, and rendered at the edge by the
dialect the request came in on. `status` is the HTTP status both dialects use;
`kind` is a stable slug (problem `type`, metric label, log field).
"""

from __future__ import annotations

from domain.consumers import EMPTY_SNAPSHOT, LimitKind, RateSnapshot
from domain.upstream_failures import FailureKind


class GatewayError(Exception):
    status: int = 500
    kind: str = "internal"
    title: str = "Internal error"
    retry_after: int | None = None
    # How far a failed upstream call got (`domain.upstream_failures`); None for everything else.
    failure: FailureKind | None = None

    def __init__(self, message: str | None = None) -> None:
        self.message = message or self.title
        super().__init__(self.message)


class InvalidRequest(GatewayError):
    status = 400
    kind = "invalid-request"
    title = "Invalid request"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class TooManySequences(GatewayError):
    """A request asking for more sequence slots than its upstream can ever grant at once
    (its admission `max_in_flight`, or one replica's `[endpoints] max_in_flight`): it could
    never be admitted, so it is refused instead of queued."""

    status = 400
    kind = "too_many_sequences"
    title = "Too many sequences"

    def __init__(self, sequences: int, limit: int) -> None:
        super().__init__(
            f"this request needs {sequences} sequence slots, more than the {limit} this upstream can ever grant"
        )
        self.sequences = sequences
        self.limit = limit


class Unauthorized(GatewayError):
    status = 401
    kind = "unauthorized"
    title = "Authentication required"


class InvalidApiKey(Unauthorized):
    """No key, an unknown or revoked key, or two different keys in one request."""

    kind = "invalid-api-key"
    title = "Invalid API key"


class Forbidden(GatewayError):
    status = 403
    kind = "forbidden"
    title = "Forbidden"


class NotFound(GatewayError):
    status = 404
    kind = "not-found"
    title = "Not found"


class ModelNotFound(NotFound):
    kind = "model-not-found"
    title = "Unknown model"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist on this gateway.")
        self.model = model


class AmbiguousModel(InvalidRequest):
    """A model name matching the aliases of several upstreams: refused, never guessed."""

    kind = "ambiguous-model"
    title = "Ambiguous model name"

    def __init__(self, model: str, upstreams: list[str]) -> None:
        names = " and ".join(f"'{u}'" for u in upstreams)
        super().__init__(
            f"The model '{model}' matches the aliases of upstreams {names}; ask for an exact model name.",
            param="model",
        )
        self.model = model


class MethodNotAllowed(GatewayError):
    status = 405
    kind = "method-not-allowed"
    title = "Method not allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    kind = "payload-too-large"
    title = "Request body too large"


class RequestTimeout(GatewayError):
    """The client did not send its request body in time (a slow or stuck client)."""

    status = 408
    kind = "request-timeout"
    title = "Request body not received in time"


class HeadersTooLarge(GatewayError):
    status = 431
    kind = "headers-too-large"
    title = "Request headers too large"


class UnsupportedMediaType(GatewayError):
    status = 415
    kind = "unsupported-media-type"
    title = "Unsupported media type"


class RateLimited(GatewayError):
    """A consumer is over one of its limits: 429 with Retry-After and the rate-limit state.

    Never takes a queue place or a slot (it is decided before admission): clients tell it
    from a full pool (503) by its status.
    """

    status = 429
    kind = "rate-limited"
    title = "Too many requests"

    def __init__(self, limit: LimitKind, retry_after: int, snapshot: RateSnapshot = EMPTY_SNAPSHOT,
                 message: str | None = None) -> None:
        super().__init__(message or f"This consumer is over its {limit.value.replace('_', ' ')} limit.")
        self.limit = limit
        self.retry_after = max(1, int(retry_after))
        self.snapshot = snapshot


class Overloaded(GatewayError):
    """Base of every 'try again later' outcome: 503 with Retry-After."""

    status = 503
    kind = "overloaded"
    title = "Service overloaded"

    def __init__(self, retry_after: int, message: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))


class QueueFull(Overloaded):
    kind = "queue-full"
    title = "Upstream queue is full"


class QueueTimeout(Overloaded):
    kind = "queue-timeout"
    title = "Timed out waiting for an upstream slot"


class Draining(Overloaded):
    kind = "draining"
    title = "Gateway is shutting down"


class AdmissionUnavailable(Overloaded):
    kind = "admission-unavailable"
    title = "Admission backend unavailable"


# The error kinds answered 503 + Retry-After (status page, dashboard: "503s by reason").
OVERLOAD_KINDS = frozenset(c.kind for c in (Overloaded, QueueFull, QueueTimeout, Draining, AdmissionUnavailable))


class UpstreamError(GatewayError):
    """The upstream failed: refused, reset, 5xx, malformed answer."""

    status = 502
    kind = "upstream-error"
    title = "Upstream error"

    def __init__(self, message: str | None = None, *, failure: FailureKind | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class UpstreamUnavailable(UpstreamError):
    kind = "upstream-unavailable"
    title = "Upstream unreachable"


class UpstreamProtocolError(UpstreamError):
    kind = "upstream-protocol-error"
    title = "Upstream sent a malformed answer"


class UpstreamTimeout(GatewayError):
    status = 504
    kind = "upstream-timeout"
    title = "Upstream timed out"

    def __init__(self, message: str | None = None, *, failure: FailureKind | None = None) -> None:
        super().__init__(message)
        self.failure = failure


class UpstreamRejected(GatewayError):
    """The upstream refused the request with a 4xx; its status and message pass through."""

    kind = "upstream-rejected"
    title = "Upstream rejected the request"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ContextLengthExceeded(UpstreamRejected):
    """The upstream refused the request as longer than the model's context window.

    Carries the upstream's numbers, so each dialect can word it the way its clients
    recognise and act on (compact the history, or ask for fewer output tokens).
    `max_tokens` is None when the upstream did not say (its prompt alone was too long).
    `exact` is False when `prompt_tokens` is only a lower bound: an upstream that stops
    counting a prompt once it is over the limit says "at least N" (a client trimming by
    the difference would trim too little).
    """

    kind = "context-length-exceeded"
    title = "Context length exceeded"

    def __init__(
        self, message: str, *, prompt_tokens: int, max_tokens: int | None, limit: int, exact: bool = True
    ) -> None:
        super().__init__(400, message)
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.limit = limit
        self.exact = exact

    @property
    def prompt_alone_too_long(self) -> bool:
        """The prompt leaves no room for a single output token (or no output size is known)."""
        return self.prompt_tokens >= self.limit or self.max_tokens is None


class ThinkingBudgetRefused(UpstreamRejected):
    """The upstream refused a request for its thinking budget: it applies none (vLLM without a
    reasoning parser). Raised before anything was generated; rendered as the 400 it is, unless
    the request may go again without the budget (`domain.reasoning`)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class NotSupported(GatewayError):
    status = 501
    kind = "not-supported"
    title = "Not supported by this upstream"
