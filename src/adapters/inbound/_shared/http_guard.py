"""Bounds on the request head, below the ASGI app: uvicorn's httptools protocol has none.

Out of the box, uvicorn with httptools buffers request headers of any size (tried: 20 MB
are accepted) and waits forever for a connection that never completes its headers.
This subclass adds two bounds, each costing a counter or one coarse timer (a set entry,
see `adapters.coarse_timers`, up to a quarter second late) per request:

- Head size: bytes received while the head is still incomplete are counted; past
  `max_bytes` the connection gets a plain-text 431 and is closed. A head that fits in
  the chunk it started in is not counted here (the ASGI layer's `max_header_bytes`
  check answers it in the surface's shape), so memory is bounded by `max_bytes`
  plus one read (256 KiB).
- Head time: a connection must complete each request head within `timeout` seconds of
  opening or of that request's first byte; otherwise it gets a plain-text 408 and is
  closed (slowloris, idle connections that never send a request).

uvicorn's keep-alive timeout between requests runs on the same coarse timers instead
of a loop timer per response (`on_response_complete`, otherwise uvicorn's own).

Requests that pass reach the app unchanged; the surface-shaped limits (431 for headers
above `server.max_header_bytes`, 408 for a slow body) are the Exchange's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from adapters.coarse_timers import CoarseTimer, CoarseTimers

_TIMER_RESOLUTION = 0.25  # the head timeout may fire this much late

_PLAIN = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
}


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded request head (see the module doc)."""

    max_bytes = 128 * 1024
    timeout = 10.0
    timers: CoarseTimers  # one per protocol class, made by `guarded_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = False
        self._fresh = False  # the current message began inside the chunk being parsed
        self._head_timer: CoarseTimer | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._fresh = False
        super().data_received(data)
        if self._in_head and not self._fresh:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_bytes:
                self._refuse(431, "Request headers too large.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._fresh, self._head_bytes = True, True, 0
        if self._head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # uvicorn's own (0.54), with the keep-alive timeout on the coarse timers; uvicorn
        # takes it back with `.cancel()` when the next request's bytes arrive.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.timeout_keep_alive_task = self.timers.call_later(  # type: ignore[assignment]
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # --- internals -------------------------------------------------------------------

    def _arm(self) -> None:
        self._head_timer = self.timers.call_later(self.timeout, self._head_timed_out)

    def _disarm(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if timer is not None:
            timer.cancel()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._refuse(408, "Request headers not received in time.")

    def _refuse(self, status: int, message: str) -> None:
        self._in_head = False
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # a pipelined head: no room for an answer
            transport.close()
            return
        body = message.encode("ascii")
        transport.write(
            _PLAIN[status]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
            + b"connection: close\r\n\r\n"
            + body
        )
        transport.close()


def guarded_protocol(max_bytes: int, timeout: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` setting, with these bounds."""
    return type(
        "GatewayHttpProtocol",
        (GuardedHttpToolsProtocol,),
        {"max_bytes": max_bytes, "timeout": timeout, "timers": CoarseTimers(_TIMER_RESOLUTION)},
    )
