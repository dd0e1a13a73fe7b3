"""A thin ASGI front that hands the dialect routes straight to their endpoints.

The dialect endpoints are raw ASGI already; going through the framework's router and
exception middleware for them costs more per request (and per streamed frame, since
the middleware wraps `send`) than the endpoint itself. Exact dialect paths are
dispatched here; everything else (operations endpoints, a dialect's 404 mount, CORS,
lifespan) goes to the Litestar app. Requests carrying an `Origin` header go through
Litestar too, so its CORS handling applies to browsers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.inbound._shared.dialect import ASGIApp


class FastPath:
    __slots__ = ("_app", "_exact", "state")

    def __init__(self, app: Any, exact: Mapping[str, ASGIApp]) -> None:
        self._app = app
        self._exact = dict(exact)
        self.state = app.state  # the framework app's state (container, protocol), for the server

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            endpoint = self._exact.get(scope["path"])
            if endpoint is not None:
                for name, _ in scope["headers"]:
                    if name == b"origin":
                        break
                else:
                    await endpoint(scope, receive, send)
                    return
        await self._app(scope, receive, send)
