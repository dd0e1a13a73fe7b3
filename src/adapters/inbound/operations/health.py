"""Liveness, readiness and Prometheus metrics (plain Litestar handlers).

The public listener gets `health_handlers` only; the ops listener all of them.
"""

from __future__ import annotations

from collections.abc import Callable

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler

_TEXT = "text/plain; charset=utf-8"


def health_handlers(ready: Callable[[], bool]) -> list[HTTPRouteHandler]:
    """`ready()` is False while draining."""

    @get("/healthz", include_in_schema=False)
    async def healthz() -> Response[bytes]:
        return Response(b"ok\n", media_type=_TEXT)

    @get("/readyz", include_in_schema=False)
    async def readyz() -> Response[bytes]:
        if ready():
            return Response(b"ready\n", media_type=_TEXT)
        return Response(b"draining\n", status_code=503, media_type=_TEXT)

    return [healthz, readyz]


def metrics_handler(metrics: Callable[[], tuple[bytes, bytes]]) -> HTTPRouteHandler:
    """`metrics()` returns (content type, exposition text)."""

    @get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response[bytes]:
        content_type, body = metrics()
        return Response(body, media_type=content_type.decode("latin-1"))

    return metrics_endpoint
