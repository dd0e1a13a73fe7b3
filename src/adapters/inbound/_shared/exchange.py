"""One HTTP exchange on raw ASGI: body, response, streaming, and client hang-ups.

Dialect endpoints run on raw ASGI (mounted through Litestar's `asgi` handlers) for
two reasons: the hot path costs little more than the server itself, and a hang-up
must be noticed while the request waits for a slot or for the upstream, when the
handler has nothing to send. `watch_disconnect` covers that: after the body is read,
a small task waits on `receive()` and cancels the handler when the client leaves.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from typing import Any

from adapters.coarse_timers import CoarseTimer, CoarseTimers
from domain.errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from domain.records import RequestRecord

Headers = list[tuple[bytes, bytes]]
Scope = dict[str, Any]

# The watcher task is started only once a request has run this long: a task, an event
# wake-up and a cancellation per request cost more than a fast answer itself, and a
# hang-up is then noticed at most this late.
_WATCH_AFTER = 0.005
TIMER_RESOLUTION = 0.005  # the body timeout and the watcher's start may be this late


class ClientGone(Exception):
    """The client hung up; nothing more can be sent."""


class Exchange:
    __slots__ = (
        "_cancelled",
        "_late_body",
        "_receive",
        "_send",
        "_t0",
        "_task",
        "_timers",
        "_watcher",
        "cors_headers",
        "finished",
        "gone",
        "header_bytes",
        "record",
        "request_id",
        "scope",
        "started",
        "status",
    )

    def __init__(
        self, scope: Scope, receive: Any, send: Any, surface: str, route: str, timers: CoarseTimers | None = None
    ) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.started = False
        self.finished = False
        self.status = 0
        self.gone = False
        self._cancelled = False
        self._timers = timers or CoarseTimers(TIMER_RESOLUTION)
        self._late_body = False
        self._watcher: asyncio.Task[None] | CoarseTimer | None = None
        self._task: asyncio.Task[Any] | None = None
        self._t0 = time.perf_counter()
        self.cors_headers: Headers = []
        # One pass over the headers: their size (for `max_header_bytes`) and x-request-id.
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        incoming: bytes | None = None
        session: bytes | None = None
        for key, value in scope["headers"]:
            size += len(key) + len(value)
            if key == b"x-request-id" and incoming is None:
                incoming = value
            elif key == b"x-claude-code-session-id" and session is None:
                session = value
        self.header_bytes = size
        self.request_id = _usable_request_id(incoming) or os.urandom(16).hex()
        self.record = RequestRecord(
            request_id=self.request_id, surface=surface, route=route,
            method=scope.get("method", "GET"), status=0, duration_seconds=0.0,
            session_id=_usable_request_id(session),  # logged and traced, never sent upstream
        )

    # --- request ------------------------------------------------------------------

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return value  # type: ignore[no-any-return]
        return None

    async def read_body(self, limit: int, timeout: float | None = None) -> bytes:
        """The whole body, at most `limit` bytes, received within `timeout` seconds.

        The timer bounds slow or stuck clients (slowloris); it is a coarse timer (a set
        entry, see `adapters.coarse_timers`), and a body already buffered by the server
        (the usual case) arrives at once.
        """
        declared = self.header(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidRequest("Content-Length is not a number.")
            if int(declared) > limit:
                raise PayloadTooLarge(f"The request body is larger than {limit} bytes.")
        if timeout is None:
            return await self._read_body(limit)
        task = asyncio.current_task()
        assert task is not None
        late = self._timers.call_later(timeout, self._body_late, task)
        try:
            return await self._read_body(limit)
        except asyncio.CancelledError:
            if not self._late_body:
                raise
            task.uncancel()
            raise RequestTimeout(f"The request body was not received within {timeout:g} seconds.") from None
        finally:
            late.cancel()

    def _body_late(self, task: asyncio.Task[Any]) -> None:
        self._late_body = True
        task.cancel()

    async def _read_body(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise ClientGone
            body = message.get("body", b"")
            if body:
                size += len(body)
                if size > limit:
                    raise PayloadTooLarge(f"The request body is larger than {limit} bytes.")
                chunks.append(body)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # --- hang-ups -----------------------------------------------------------------

    def watch_disconnect(self) -> None:
        """Cancel the current task when the client hangs up (call after `read_body`)."""
        self._task = asyncio.current_task()
        self._watcher = self._timers.call_later(_WATCH_AFTER, self._start_watching)

    def _start_watching(self) -> None:
        if not self.finished:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        if not self.finished:
            self.gone = True
            if self._task is not None:
                self._cancelled = True
                self._task.cancel()

    def stop_watching(self) -> None:
        """Stop the watcher; after a hang-up, absorb the cancellation it caused."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()  # a pending timer or a running task; either way it stops here
        if self._cancelled and self._task is not None:
            self._cancelled = False
            self._task.uncancel()

    # --- response -------------------------------------------------------------------

    def _base_headers(self, content_type: bytes, extra: Iterable[tuple[bytes, bytes]]) -> Headers:
        headers: Headers = [(b"content-type", content_type), (b"x-request-id", self.request_id.encode())]
        headers.extend(extra)
        headers.extend(self.cors_headers)
        return headers

    async def respond(
        self, status: int, body: bytes, content_type: bytes,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        all_headers = self._base_headers(content_type, headers)
        all_headers.append((b"content-length", str(len(body)).encode()))
        self.status = status
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": all_headers})
        self.finished = True
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(
        self, status: int, content_type: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        all_headers = self._base_headers(content_type, headers)
        all_headers.append((b"cache-control", b"no-cache"))
        all_headers.append((b"x-accel-buffering", b"no"))  # nginx/ingress: do not buffer SSE
        self.status = status
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": all_headers})

    async def send_chunk(self, data: bytes) -> None:
        if self.gone:
            raise ClientGone
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self, data: bytes = b"") -> None:
        self.finished = True
        if not self.gone:
            await self._send({"type": "http.response.body", "body": data})

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def close_record(self) -> RequestRecord:
        record = self.record
        record.status = self.status if not self.gone or self.started else 499
        record.client_gone = self.gone
        record.duration_seconds = self.elapsed()
        return record


def _usable_request_id(value: bytes | None) -> str | None:
    """A client's x-request-id when it is printable ASCII of at most 128 characters."""
    if value and len(value) <= 128 and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None
