"""Liveness, readiness and Prometheus metrics (plain Litestar handlers).

The public listener gets `health_handlers` only; the ops listener all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler

from adapters.inbound.operations.text_response import text_response

_TEXT = "text/plain; charset=utf-8"


def health_handlers(
    ready: Callable[[], bool], without_replicas: Callable[[], Sequence[str]] | None = None
) -> list[HTTPRouteHandler]:
    """`ready()` is False while draining. `without_replicas()`: the upstreams (`[endpoints]`) whose
    discovery answers no ready replica now; `/readyz` names them and stays ready (200), since the
    other upstreams still serve and a restart would not bring a replica back."""

    @get("/healthz", include_in_schema=False)
    async def healthz() -> Response[bytes]:
        return text_response(b"ok\n", _TEXT)

    @get("/readyz", include_in_schema=False)
    async def readyz() -> Response[bytes]:
        if ready():
            idle = without_replicas() if without_replicas is not None else ()
            lines = "".join(f"upstream {name}: no ready replica\n" for name in idle)
            return text_response(f"ready\n{lines}".encode(), _TEXT)
        return text_response(b"draining\n", _TEXT, status_code=503)

    return [healthz, readyz]


def metrics_handler(metrics: Callable[[], tuple[bytes, bytes]]) -> HTTPRouteHandler:
    """`metrics()` returns (content type, exposition text)."""

    @get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response[bytes]:
        content_type, body = metrics()
        return text_response(body, content_type.decode("latin-1"))

    return metrics_endpoint
