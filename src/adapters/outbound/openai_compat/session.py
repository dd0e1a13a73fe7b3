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
  methods; its trace signal `on_connection_reuseconn` marks the request's `Attempt` as
  sent on a reused connection, so the client can make its own single resend of a POST
  (see `client.py`); `on_request_headers_sent` marks it as sent, so a timeout tells a
  connect that never finished from a request the replica may be working on.

The container opens one session per upstream address in the serving loop (aiohttp binds
a session to the running loop) and closes it at shutdown.
"""

from __future__ import annotations

import ssl
from types import SimpleNamespace
from urllib.parse import urlsplit

import aiohttp

KEEPALIVE_SECONDS = 4.0


class Attempt:
    """Per request: whether aiohttp sent it on a pooled (reused) connection, and whether its
    head went out (the upstream may have started on it)."""

    __slots__ = ("reused", "sent")

    def __init__(self) -> None:
        self.reused = False
        self.sent = False


async def _on_reuse(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, Attempt):
        attempt.reused = True


async def _on_sent(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    attempt = ctx.trace_request_ctx
    if isinstance(attempt, Attempt):
        attempt.sent = True


def upstream_session(base_url: str) -> aiohttp.ClientSession:
    """A session for the server at `base_url`; call it inside the running event loop."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_on_reuse)
    trace.on_request_headers_sent.append(_on_sent)
    secure = urlsplit(base_url).scheme == "https"
    connector = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=0,
        keepalive_timeout=KEEPALIVE_SECONDS,
        ssl=ssl.create_default_context() if secure else True,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),  # every call passes its own (client.py)
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
        trace_configs=[trace],
    )
