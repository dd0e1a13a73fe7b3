"""Failures at the edge: anything a handler raises becomes one domain error, shown by the dialect.

Each dialect Router registers `exception_handler(its renderer)` for `Exception`, so its
own failures, Litestar's (404, 405, 413, a bad Content-Length) and faults nobody
expected all come out in that surface's shape; an unexpected fault is logged and
answered 500 without internals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from litestar import Request, Response
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE

from adapters.inbound._shared.call import call_of
from adapters.inbound._shared.limits import deep_json
from domain.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound, PayloadTooLarge

log = logging.getLogger("gateway.edge")
Headers = list[tuple[bytes, bytes]]


class ErrorRenderer(Protocol):
    """How one dialect shows a failure."""

    def render(self, error: GatewayError, request_id: str) -> tuple[int, bytes, bytes, Headers]:
        """(status, body, content type, extra headers) of an error response."""
        ...

    def stream_error(self, error: GatewayError, request_id: str) -> bytes:
        """The terminal frame for a failure after the stream started."""
        ...


class InternalError(GatewayError):
    """An unexpected fault: rendered as a 500 that reveals nothing internal."""

    title = "Internal error"

    def __init__(self) -> None:
        super().__init__("The gateway failed to process this request. Quote the request id when reporting it.")


def retry_after_headers(error: GatewayError) -> Headers:
    if error.retry_after is None:
        return []
    return [(b"retry-after", str(error.retry_after).encode())]


def as_gateway_error(exc: BaseException, request: Request[Any, Any, Any], request_id: str) -> GatewayError:
    """The one domain decision for whatever a request raised."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, NotFoundException):
        return NotFound(f"There is no route {request.url.path!r} on this gateway.")
    if isinstance(exc, MethodNotAllowedException):
        return MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}.")
    if isinstance(exc, HTTPException) and exc.status_code == HTTP_413_REQUEST_ENTITY_TOO_LARGE:
        limit = request.route_handler.resolve_request_max_body_size()
        return PayloadTooLarge(f"The request body is larger than {limit} bytes.")
    if isinstance(exc, HTTPException) and 400 <= exc.status_code < 500:
        error = InvalidRequest(exc.detail)  # e.g. an unparsable Content-Length
        error.status = exc.status_code
        return error
    if isinstance(exc, RecursionError):
        # JSON nested beyond what msgspec can decode or re-encode: the client's doing.
        log.warning("request %s nested too deeply", request_id, extra={"request_id": request_id})
        return deep_json()
    log.error("unhandled error in request %s", request_id, exc_info=exc, extra={"request_id": request_id})
    return InternalError()


def exception_handler(errors: ErrorRenderer) -> Callable[[Request[Any, Any, Any], Exception], Response[bytes]]:
    """A Router's handler for every exception: the failure in the dialect's shape."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        call = call_of(request)
        error = as_gateway_error(exc, request, call.request_id)
        if not call.gone:
            call.record.error_kind = error.kind
        status, body, content_type, extra = errors.render(error, call.request_id)
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in extra}
        if status == 408:  # a stuck client: do not wait for the rest of its body
            headers["connection"] = "close"
        elif status == 401:  # RFC 9110: a 401 names the scheme it wants
            headers["www-authenticate"] = "Bearer"
        return Response(body, status_code=status, media_type=content_type.decode("latin-1"), headers=headers)

    return handle


def stream_failure(exc: Exception, errors: ErrorRenderer, request: Request[Any, Any, Any]) -> bytes:
    """The terminal frame for a failure after the stream started (never a broken stream)."""
    call = call_of(request)
    error = as_gateway_error(exc, request, call.request_id)
    call.record.error_kind = error.kind
    return errors.stream_error(error, call.request_id)

