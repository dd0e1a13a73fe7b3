"""Bounds below the ASGI app that uvicorn's httptools protocol lacks: the request head, a stalled reader.

Out of the box, uvicorn with httptools buffers request headers of any size (tried: 20 MB
are accepted), waits forever for a connection that never completes its headers, and
waits forever to write to a client that stops reading, with no option for any of them.
This subclass adds the three bounds and nothing else; it overrides only asyncio's
protocol callbacks and httptools' parser callbacks, each calling uvicorn's own, and reads
only public attributes (`transport`, `loop`, `cycle` and its `scope` and
`response_complete`):

- Head size: bytes received while the head is still incomplete are counted; past
  `max_bytes` the connection gets a plain-text 431 and is closed. A head that fits in
  the chunk it started in is not counted here (the app's `max_header_bytes` check
  answers it in the surface's shape), so memory is bounded by `max_bytes` plus one
  read (256 KiB).
- Head time: a connection must complete each request head within `timeout` seconds of
  opening or of that request's first byte; otherwise it gets a plain-text 408 and is
  closed (slowloris, idle connections that never send a request). Between requests an
  idle connection is uvicorn's business (its `timeout_keep_alive`, the gateway's
  `keep_alive_timeout_seconds`). One lazy event-loop timer per connection, not one per
  request: a head notes when it began, a complete head only clears that, and the timer,
  when it fires, closes the connection if the pending head is overdue, is set again for
  its deadline if it is not, or is dropped (until the next head) if none is pending.
- Stalled readers: when the transport's write buffer passes its high-water mark, asyncio
  calls `pause_writing` and uvicorn's `send` waits (its flow control) until
  `resume_writing`. A client that stops reading would hold that wait, and the request's
  slot, forever: while writing is paused, the client must take in `PROGRESS` bytes (the
  buffer shrinks by that much) in every `write_timeout` seconds, or the connection is
  aborted. A slow client that reads a large answer steadily is not dropped; one that
  trickles a few bytes to keep it open is. uvicorn then sees a lost connection and the
  app an `http.disconnect`, so the request ends exactly as a hang-up does (the edge frees
  the slot and closes the upstream response); the edge labels it `client_stalled`
  (`note_stalled`, on the request's scope). A timeout around the app's `send` could end
  the request but not the connection: ASGI has no abort, and closing waits to flush a
  buffer the client never reads.

- Hang-ups: when the connection is lost before a response's end, the edge is told at once
  (`note_hang_up` on the request's scope, which carries `HANG_UP_NOTICE` in its state), so a
  request waiting with nothing sent yet (queued, or on a non-streaming upstream) is cancelled
  and frees its slot without a task of its own waiting on `receive()`.

- Whole bodies: once a request's body has been received, its scope's state says so
  (`BODY_RECEIVED`), and the edge reads it without a timer (it cannot wait).

Requests that pass reach the app unchanged (but for those marks in their scope's state).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from adapters.inbound._shared.call import BODY_RECEIVED, HANG_UP_NOTICE, note_hang_up, note_stalled

log = logging.getLogger("gateway.edge")
PROGRESS = 64 * 1024  # bytes a paused writer's client must take in per write timeout

_STATUS_LINES = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
}


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded request head (see the module doc)."""

    max_bytes = 128 * 1024
    timeout = 10.0
    write_timeout = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = False
        self._head_fresh = False  # the current head began inside the chunk being parsed
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since: float | None = None  # when the pending head's time began; None: no head pending
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_mark = 0  # the write buffer's size when the stall timer was (re)armed

    # asyncio.Protocol callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_since = self.loop.time()  # the first head is timed from the connection's opening
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_stall_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            note_hang_up(cycle.scope)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._arm_stall_timer()

    def resume_writing(self) -> None:
        self._disarm_stall_timer()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        self._head_fresh = False
        super().data_received(data)
        if self._in_head and not self._head_fresh:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_bytes:
                self._refuse(431, "Request headers too large.")

    # httptools parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["state"][HANG_UP_NOTICE] = True  # `connection_lost` tells the edge
        self._in_head, self._head_fresh, self._head_bytes = True, True, 0
        if self._head_since is None:  # else: the first head, timed from the connection's opening
            self._head_since = self.loop.time()
        if self._head_timer is None:
            self._arm_head_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.scope["state"][BODY_RECEIVED] = True  # the edge reads it without a timer

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_since = None  # the timer stays: cheaper than one per request (module doc)
        super().on_headers_complete()

    # the bounds

    def _arm_head_timer(self) -> None:
        assert self._head_since is not None
        self._head_timer = self.loop.call_at(self._head_since + self.timeout, self._head_check)

    def _disarm_head_timer(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if timer is not None:
            timer.cancel()

    def _head_check(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None:
            return  # no head pending: the next one sets the timer again
        if self.loop.time() < since + self.timeout:
            self._arm_head_timer()  # a later head than the one the timer was set for
            return
        self._refuse(408, "Request headers not received in time.")

    def _disarm_stall_timer(self) -> None:
        timer, self._stall_timer = self._stall_timer, None
        if timer is not None:
            timer.cancel()

    def _arm_stall_timer(self) -> None:
        self._stall_mark = self.transport.get_write_buffer_size()
        self._stall_timer = self.loop.call_later(self.write_timeout, self._stall_check)

    def _stall_check(self) -> None:
        """Writing stayed paused for `write_timeout`: drop the client unless it is reading."""
        self._stall_timer = None
        if self.transport.get_write_buffer_size() <= self._stall_mark - PROGRESS:
            self._arm_stall_timer()  # slow, but reading
            return
        cycle = self.cycle
        if cycle is not None:
            request_id = note_stalled(cycle.scope)
            if cycle.response_complete:  # its access-log line is written: say it here
                log.warning("request %s: the client stopped reading its answer for %gs; connection dropped",
                            request_id, self.write_timeout, extra={"request_id": request_id})
        self.transport.abort()

    def _refuse(self, status: int, message: str) -> None:
        self._in_head = False
        self._head_since = None
        self._disarm_head_timer()
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # a pipelined head: no room for an answer
            transport.close()
            return
        body = message.encode("ascii")
        transport.write(
            _STATUS_LINES[status]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: " + str(len(body)).encode("ascii") + b"\r\n"
            + b"connection: close\r\n\r\n"
            + body
        )
        transport.close()


def guarded_protocol(max_bytes: int, timeout: float, write_timeout: float = 30.0) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` setting, with these bounds."""
    bounds = {"max_bytes": max_bytes, "timeout": timeout, "write_timeout": write_timeout}
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), bounds)
