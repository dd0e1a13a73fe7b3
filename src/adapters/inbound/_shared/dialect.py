"""The registration point for inbound dialects, and the Router every dialect is built as.

A dialect is a package under `adapters/inbound/` exposing `router(context) -> Router`.
Bootstrap lists the dialects it serves; adding one touches nothing in domain, ports,
application or outbound code. `dialect_router` gives each the same edge: one record
per request (begun here, reported by `edge.EdgeMiddleware`, which wraps the app), the
header-size limit, the API key (when required), the consumer's request count and in-flight
slot (on the handlers marked `METERED`: those that reach a model), the body-size limit,
and every failure (Litestar's 404/405/413 included) rendered by the dialect's own
`ErrorRenderer`. Everything up to the consumer slot is decided before the
body is read: a refused request costs no body and no decode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response, Router, route
from litestar.enums import HttpMethod
from litestar.handlers import HTTPRouteHandler

from adapters.inbound._shared.auth import Authenticator, identify
from adapters.inbound._shared.call import call_of
from adapters.inbound._shared.errors import ErrorRenderer, exception_handler
from adapters.inbound._shared.limits import InputLimits
from adapters.inbound._shared.problem import DEFAULT_PROBLEM_BASE
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.consumer_limits import OPEN_DOOR
from domain.errors import HeadersTooLarge, MethodNotAllowed, NotFound
from ports.consumers import CredentialStore
from ports.telemetry import RequestObserver


@dataclass(frozen=True, slots=True)
class EdgeContext:
    """What every dialect gets from bootstrap."""

    service: ChatService
    observer: RequestObserver
    max_body_bytes: int
    ping_interval_seconds: float
    options: dict[str, Any] = field(default_factory=dict)
    limits: InputLimits = field(default_factory=InputLimits)
    # The keys file when `[auth] mode = "required"`; None: every request is anonymous.
    credentials: CredentialStore | None = None
    # The other operations of a model server (the `/v1` text completions and embeddings
    # paths); a dialect built without them (tests, a third dialect) does not serve them.
    completions: CompletionService | None = None
    embeddings: EmbeddingService | None = None
    # `[server] problem_base_url`: the base of the `/v1` problem documents' `type` URIs, ending in '/'.
    problem_base_url: str = DEFAULT_PROBLEM_BASE


DialectRouter = Callable[[EdgeContext], Router]
"""What a dialect package exports as `router`, and what bootstrap's `DIALECTS` lists."""

# A route handler's `opt`: its requests count toward the consumer's requests_per_minute and
# max_in_flight (every handler that reaches a model; not the model list or unknown paths).
_METERED = "consumer_limits"
METERED = {_METERED: True}

# Methods a dialect answers itself when a path does not take them (OPTIONS stays
# Litestar's, for CORS preflights; HEAD is answered by Litestar's routing).
_METHODS = {HttpMethod.GET, HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE}


def _edge_checks(
    surface: str, observer: RequestObserver, limit: int, store: CredentialStore | None, service: ChatService
) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """The request's record begun (this Router's surface, the route), then the head's size, the
    key and (metered handlers) the consumer's request count and slot: before the body is read,
    before anything else can refuse.

    The Router's `before_request` hook (Litestar runs it right before the handler, inside
    the route's exception handling, so a refusal is rendered in the dialect's shape), not
    a guard: Litestar copies the route handler for every guard call, per request. The slot
    is held on the request's `Call` and released by the edge middleware when the request ends.
    """

    keys = Authenticator(store) if store is not None else None

    async def check(request: Request[Any, Any, Any]) -> None:
        call = call_of(request)
        call.begin(surface, observer, request.scope)
        size = call.header_bytes
        if limit and size > limit:
            raise HeadersTooLarge(
                f"The request target and headers are {size} bytes; this gateway accepts at most {limit}."
            )
        if keys is not None:
            identify(call, request.scope["headers"], keys)
            if request.route_handler.opt.get(_METERED):
                door = await service.admit(call.identity.consumer, call.record)
                if door is not OPEN_DOOR:  # nothing taken: no release to await at the request's end
                    call.door = door

    return check


def _not_allowed(methods: list[HttpMethod], path: str) -> HTTPRouteHandler:
    @route(path, http_method=methods, status_code=405, include_in_schema=False)
    async def not_allowed(request: Request[Any, Any, Any]) -> Response[bytes]:
        raise MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}.")

    return not_allowed


def _no_such_route() -> HTTPRouteHandler:
    @route("/{path:path}", http_method=list(_METHODS), status_code=404, include_in_schema=False)
    async def no_such_route(request: Request[Any, Any, Any]) -> Response[bytes]:
        raise NotFound(f"There is no route {request.url.path!r} on this gateway.")

    return no_such_route


def dialect_router(
    path: str, surface: str, handlers: Sequence[HTTPRouteHandler], errors: ErrorRenderer, context: EdgeContext,
    *, unknown_paths: bool = True,
) -> Router:
    """A dialect's Router: its handlers under `path`, plus the shared edge (module doc).

    Unknown paths under `path` and methods a path does not take are answered here, so
    they keep the surface's error shape; `surface` labels the records (logs, metrics).
    A dialect that shares its prefix with another (the Responses API lives under `/v1`)
    passes `unknown_paths=False`: the prefix's owner answers them (one catch-all per prefix).
    """
    taken: dict[str, set[HttpMethod]] = {}
    for handler in handlers:
        for handler_path in handler.paths:
            taken.setdefault(handler_path, set()).update(HttpMethod(m) for m in handler.http_methods)
    refusals = [_not_allowed(sorted(_METHODS - methods), p) for p, methods in taken.items()]
    checks = _edge_checks(surface, context.observer, context.limits.max_header_bytes, context.credentials,
                          context.service)
    return Router(
        path=path,
        route_handlers=[*handlers, *refusals, *([_no_such_route()] if unknown_paths else [])],
        before_request=checks,
        exception_handlers={Exception: exception_handler(errors)},
        request_max_body_size=context.max_body_bytes,
        tags=[surface],  # the OpenAPI document groups each dialect's operations
    )
