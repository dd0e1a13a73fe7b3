"""The frame every dialect endpoint runs in: errors, hang-ups, one record per request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from adapters.coarse_timers import CoarseTimers
from adapters.inbound._shared.dialect import Route
from adapters.inbound._shared.exchange import TIMER_RESOLUTION, ClientGone, Exchange
from adapters.inbound._shared.limits import deep_json
from domain.errors import GatewayError, HeadersTooLarge, MethodNotAllowed, NotFound
from ports.telemetry import RequestObserver

log = logging.getLogger("gateway.edge")


class ErrorRenderer(Protocol):
    """How one dialect shows a failure."""

    def render(self, error: GatewayError, request_id: str) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
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


Work = Callable[[Exchange], Awaitable[None]]


async def serve(
    ex: Exchange, work: Work, errors: ErrorRenderer, observer: RequestObserver
) -> None:
    """Run `work` for one exchange; render any failure in the dialect's shape.

    A failure before the response started becomes an error response; after, a
    terminal in-stream error frame. A hang-up cancels the work (see `Exchange`); its
    cancellation is absorbed here, so `finally` blocks below have released every slot.
    """
    handle = observer.request_started(ex.record, ex.scope["headers"])
    try:
        await work(ex)
    except asyncio.CancelledError:
        if not ex.gone:
            raise
    except ClientGone:
        ex.gone = True
    except GatewayError as error:
        await _fail(ex, error, errors)
    except RecursionError:
        # JSON nested beyond what msgspec can decode or re-encode: the client's doing.
        log.warning("request %s nested too deeply", ex.request_id, extra={"request_id": ex.request_id})
        await _fail(ex, deep_json(), errors)
    except Exception:
        log.exception("unhandled error in request %s", ex.request_id, extra={"request_id": ex.request_id})
        await _fail(ex, InternalError(), errors)
    finally:
        ex.stop_watching()
        observer.request_finished(ex.close_record(), handle)


async def _fail(ex: Exchange, error: GatewayError, errors: ErrorRenderer) -> None:
    ex.record.error_kind = error.kind
    if ex.gone:
        return
    try:
        if not ex.started:
            status, body, content_type, headers = errors.render(error, ex.request_id)
            if status == 408:  # a stuck client: do not wait for the rest of its body
                headers = [*headers, (b"connection", b"close")]
            await ex.respond(status, body, content_type, headers)
        elif not ex.finished:
            await ex.end_stream(errors.stream_error(error, ex.request_id))
    except (ClientGone, OSError):
        ex.gone = True


def retry_after_headers(error: GatewayError) -> list[tuple[bytes, bytes]]:
    if error.retry_after is None:
        return []
    return [(b"retry-after", str(error.retry_after).encode())]


async def _not_allowed(ex: Exchange) -> None:
    raise MethodNotAllowed(f"{ex.scope.get('method')} is not allowed on {ex.record.route}.")


def asgi_endpoint(
    surface: str, route: str, methods: tuple[str, ...], work: Work,
    errors: ErrorRenderer, observer: RequestObserver, max_header_bytes: int = 0,
) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """A raw ASGI callable running `work` inside `serve` for the given methods.

    `max_header_bytes` (0: unchecked) bounds the request target plus header names and
    values; a larger request is answered 431 in the dialect's shape.
    """

    async def too_large(ex: Exchange) -> None:
        raise HeadersTooLarge(
            f"The request target and headers are {ex.header_bytes} bytes; "
            f"this gateway accepts at most {max_header_bytes}."
        )

    timers = CoarseTimers(TIMER_RESOLUTION)  # the body timeouts and hang-up watchers of this route

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        ex = Exchange(scope, receive, send, surface, route, timers)
        run: Work
        if scope["method"] not in methods:
            run = _not_allowed
        elif max_header_bytes and ex.header_bytes > max_header_bytes:
            run = too_large
        else:
            run = work
        await serve(ex, run, errors, observer)

    return endpoint


ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


async def _no_such_route(ex: Exchange) -> None:
    path = ex.scope.get("raw_path", b"").decode("latin-1", "replace") or ex.record.route
    raise NotFound(f"There is no route {path.split('?')[0]!r} on this gateway.")


def not_found_route(
    surface: str, prefix: str, errors: ErrorRenderer, observer: RequestObserver, header_limit: int = 0
) -> Route:
    """A mount under `prefix` answering unknown paths with 404 in the dialect's own shape."""
    endpoint = asgi_endpoint(surface, prefix + "/*", ALL_METHODS, _no_such_route, errors, observer, header_limit)
    return Route(prefix, ALL_METHODS, endpoint, mount=True)
