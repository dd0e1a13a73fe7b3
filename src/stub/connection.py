"""HTTP/1.1 on asyncio.Protocol + httptools: no web framework, pre-built bytes only.

One ``HttpProtocol`` per connection parses requests with httptools (Content-Length and
chunked bodies), answers them strictly in order (pipelining-safe), keeps the connection
alive unless the client asked otherwise, and reports connection loss at once: it
cancels the task of a request still holding or streaming.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import traceback
from collections import deque
from typing import Protocol, cast

import httptools

from stub.schema import error_body

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error", 502: b"Bad Gateway"}
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
)
CHUNKED_END = b"0\r\n\r\n"


def response(status: int, body: bytes, keep_alive: bool, ctype: bytes = b"application/json") -> bytes:
    """A complete HTTP/1.1 response with Content-Length."""
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
        status,
        _REASONS.get(status, b"Error"),
        ctype,
        len(body),
    )
    return head + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n") + body


def chunked(frames: list[bytes]) -> bytes:
    """Each SSE frame as its own HTTP chunk, joined for a single transport write."""
    return b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames)


class Handler(Protocol):
    """What a connection needs from the application (``stub.server.Stub``)."""

    def handle(
        self, proto: HttpProtocol, method: bytes, path: bytes, body: bytes, keep: bool
    ) -> asyncio.Task[None] | None: ...

    def release(self, proto: HttpProtocol) -> None: ...

    log_headers: bool
    log_bodies: bool


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse with httptools, answer requests strictly in order."""

    def __init__(self, stub: Handler) -> None:
        self.stub = stub
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.expect_continue = False
        # (method, path, body, keep-alive, traceparent header, header names) of each parsed request
        self.pending: deque[tuple[bytes, bytes, bytes, bool, bytes, bytes]] = deque()
        self.traceparent = b""  # of the request being answered
        self.header_names = b""  # of the request being answered, with --log-headers
        self.request_body = b""  # of the request being answered, with --log-bodies
        self.incoming_traceparent = b""
        self.incoming_names: list[bytes] = []
        self.task: asyncio.Task[None] | None = None
        self.counted = False  # a chat request of this connection is in flight
        self.closed = False
        self.paused = False
        self.writable: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self.pending:  # no upgrades here: answer over HTTP/1.1, then close
                method, path, body, _, parent, names = self.pending[-1]
                self.pending[-1] = (method, path, body, False, parent, names)
        except httptools.HttpParserError as exc:  # queued, so earlier answers go out first
            self.pending.append((b"!", str(exc).encode(), b"", False, b"", b""))
        self.process()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.stub.release(self)  # at once: the client is gone, like a vLLM abort
        if self.task is not None:
            self.task.cancel()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def eof_received(self) -> bool | None:
        """The client closed its side: gone, like a reset (release at once, then close)."""
        self.stub.release(self)
        return None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    # -- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.body, self.expect_continue = b"", [], False
        self.incoming_traceparent = b""
        self.incoming_names = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if self.stub.log_headers:
            self.incoming_names.append(lowered)
        if lowered == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        elif lowered == b"traceparent":
            self.incoming_traceparent = value

    def on_headers_complete(self) -> None:
        if self.expect_continue and self.task is None and not self.pending and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0]
        method = self.parser.get_method()
        self.pending.append((method, path, b"".join(self.body), self.parser.should_keep_alive(),
                             self.incoming_traceparent, b",".join(self.incoming_names)))

    # -- request processing -------------------------------------------------------------
    def process(self) -> None:
        """Answer queued requests in order until one needs to wait."""
        while self.pending and self.task is None and not self.closed:
            method, path, body, keep, self.traceparent, self.header_names = self.pending.popleft()
            if method == b"!":
                message = f"Invalid HTTP request: {path.decode(errors='replace')}"
                self.finish(response(400, error_body(400, message), False), False)
                return
            task = self.stub.handle(self, method, path, body, keep)
            if task is not None:
                self.task = task
                task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None:
            traceback.print_exception(task.exception())
            self.stub.release(self)
            if self.transport is not None:
                self.transport.abort()
            return
        self.process()

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def finish(self, data: bytes, keep_alive: bool) -> None:
        """Write the end of a response; close the connection unless it is kept alive."""
        self.write(data)
        if not keep_alive and self.transport is not None:
            self.pending.clear()
            self.transport.close()

    def reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0): an upstream crash, not a close."""
        if self.closed or self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.pending.clear()
        self.transport.abort()

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        if self.paused and not self.closed:
            self.writable = asyncio.get_running_loop().create_future()
            await self.writable
