"""Operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.inbound._shared.dialect import Route

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]


def _plain(status: int, body: bytes, headers: list[tuple[bytes, bytes]] = _TEXT) -> Any:
    async def send_all(send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return send_all


def operations_routes(metrics: Callable[[], tuple[bytes, bytes]], ready: Callable[[], bool]) -> list[Route]:
    """`metrics()` returns (content type, exposition text); `ready()` is False while draining."""

    async def healthz(scope: Any, receive: Any, send: Any) -> None:
        await _plain(200, b"ok\n")(send)

    async def readyz(scope: Any, receive: Any, send: Any) -> None:
        if ready():
            await _plain(200, b"ready\n")(send)
        else:
            await _plain(503, b"draining\n")(send)

    async def metrics_endpoint(scope: Any, receive: Any, send: Any) -> None:
        content_type, body = metrics()
        await _plain(200, body, [(b"content-type", content_type)])(send)

    return [
        Route("/healthz", ("GET", "HEAD"), healthz),
        Route("/readyz", ("GET", "HEAD"), readyz),
        Route("/metrics", ("GET",), metrics_endpoint),
    ]
