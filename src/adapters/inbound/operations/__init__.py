"""Operations endpoints: health on both listeners; metrics and the status page on the ops one.

The public listener serves `health_handlers` (kubelet probes); the ops listener
(`[ops] listen`) is a Litestar app of its own (`ops_app`): `/metrics`, `/healthz`,
`/readyz`, `/status` and `/status.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
from litestar import Litestar, Response, get

from adapters.inbound.operations.health import health_handlers, metrics_handler
from adapters.inbound.operations.status_page import render
from adapters.inbound.operations.text_response import text_response
from ports.status import StatusReport, StatusSource

__all__ = ["health_handlers", "ops_app"]

_JSON = msgspec.json.Encoder()


def ops_app(
    metrics: Callable[[], tuple[bytes, bytes]], ready: Callable[[], bool], status: StatusSource,
    without_replicas: Callable[[], Sequence[str]] | None = None,
) -> Litestar:
    """The ops listener's app; its state is the main app's (same process, same objects)."""

    @get("/status", include_in_schema=False)
    async def status_page() -> Response[bytes]:
        return text_response(render(status.report()).encode(), "text/html; charset=utf-8",
                             headers={"cache-control": "no-store"})

    @get("/status.json", include_in_schema=False)
    async def status_json() -> Response[bytes]:
        report: StatusReport = status.report()
        return Response(_JSON.encode(report), media_type="application/json", headers={"cache-control": "no-store"})

    return Litestar(
        route_handlers=[*health_handlers(ready, without_replicas), metrics_handler(metrics), status_page, status_json],
        openapi_config=None, logging_config=None,
    )
