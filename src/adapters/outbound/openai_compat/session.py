"""The aiohttp `ClientSession` for one model server, tuned for what an upstream call is.

- No connection limit: admission (`max_in_flight`) is the only queue, so a capped
  upstream never has more connections than its cap, plus idle ones.
- Idle connections close after `KEEPALIVE_SECONDS`, below the 5 s keep-alive of uvicorn
  (which vLLM runs on), so the upstream rarely closes one just as we reuse it.
- No automatic decompression (`Accept-Encoding: identity` is sent instead: SSE frames
  are relayed as they come), no cookie jar, no `User-Agent`.
- `https://` upstreams are verified against the system's CA store, or the bundle named
  by `SSL_CERT_FILE` / `SSL_CERT_DIR` (what `ssl.create_default_context()` loads).
- aiohttp resends a request that met a stale keep-alive connection only for idempotent
  methods; the session's connector marks the request's `Attempt` (`CURRENT_ATTEMPT`, set
  by the client around its POST) as sent on a reused connection when the connection it
  hands out is one it handed out before, so the client can make its own single resend of
  a POST (see `transport.py`); and as sent once it has a connection (the head is written
  right after, in the same step), so a timeout tells a connect that never finished from a
  request the replica may be working on. Not aiohttp's trace signals: a `TraceConfig`
  makes aiohttp send every signal of every request through its tracing machinery
  (about 70k instructions per request, for these two facts).

The container opens one session per upstream address in the serving loop (aiohttp binds
a session to the running loop) and closes it at shutdown.
"""

from __future__ import annotations

import ssl
import weakref
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

KEEPALIVE_SECONDS = 4.0


class Attempt:
    """Per request: whether aiohttp sent it on a pooled (reused) connection, and whether its
    head went out (the upstream may have started on it)."""

    __slots__ = ("reused", "sent")

    def __init__(self) -> None:
        self.reused = False
        self.sent = False


CURRENT_ATTEMPT: ContextVar[Attempt | None] = ContextVar("gateway_upstream_attempt", default=None)
"""The `Attempt` of the POST the current task is sending (the client sets it around the call)."""


class _Connector(aiohttp.TCPConnector):
    """aiohttp's TCP connector, noting on the current `Attempt` how its connection was got."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gateway_seen: weakref.WeakSet[object] = weakref.WeakSet()  # live connections seen

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol  # one per TCP connection: seen before means taken from the pool
        reused = protocol in self._gateway_seen
        if not reused:  # whoever made the request (a probe, a scrape): its connection may be pooled
            self._gateway_seen.add(protocol)
        attempt = CURRENT_ATTEMPT.get()
        if attempt is not None:
            attempt.reused = reused
            attempt.sent = True
        return conn


def upstream_session(base_url: str) -> aiohttp.ClientSession:
    """A session for the server at `base_url`; call it inside the running event loop."""
    secure = urlsplit(base_url).scheme == "https"
    connector = _Connector(
        limit=0,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
        ssl=ssl.create_default_context() if secure else True,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),  # every call passes its own (transport.py)
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )
