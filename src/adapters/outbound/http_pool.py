"""A keep-alive HTTP/1.1 client for upstream calls: asyncio Protocols + the httptools parser.

Why not aiohttp here: under load its client was a third of the gateway's CPU per proxied
request (bench/RESULTS.md: request and response objects, header multidicts, payload
registry, stream readers, timer contexts). An upstream call needs far less: one request at
a time per connection, a body of bytes out, the status, the content type and the body's
bytes back as they arrive. That is what this module does, and nothing more:

- `HttpPool` holds one origin's idle connections, most recently used first. An idle
  connection is closed once it has idled `keepalive_seconds` (below uvicorn's 5 s, what vLLM
  runs on), and a request that finds its reused connection closed before any byte of the
  answer is sent again once on a fresh one: the keep-alive race, never a half-done request.
- A response whose body was received to its end gives its connection back at once; closing
  a response before that aborts the connection, which is how the upstream learns the
  client went away (vLLM aborts the generation).
- Timeouts are armed only while a read really waits, on the pool's `CoarseTimers` (one
  loop timer for all of them, up to `_TIMER_RESOLUTION` late).
- Reading pauses when more than `_HIGH_WATER` bytes wait unread (a slow client does not
  make the gateway buffer a whole answer).

Failures are raised as the `TransportError` types below; the caller maps them to its own.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

from adapters.coarse_timers import CoarseTimers

_HIGH_WATER = 1 << 20  # unread bytes before reading from the socket pauses
_TIMER_RESOLUTION = 0.05  # seconds a timeout may fire late


class TransportError(Exception):
    """A failed upstream exchange; the message may name the address (log it, do not show it)."""


class ConnectFailed(TransportError):
    """No connection: refused, unresolvable, TLS handshake failed."""


class ConnectTimedOut(TransportError):
    """No connection within the connect timeout."""


class ResponseTimedOut(TransportError):
    """The answer (its head, or the next bytes of its body) did not come in time."""


class ConnectionBroken(TransportError):
    """The connection closed or failed before the answer was complete."""

    def __init__(self, message: str, *, before_answer: bool = False) -> None:
        super().__init__(message)
        self.before_answer = before_answer  # nothing of the answer had arrived yet


class MalformedResponse(TransportError):
    """The upstream's bytes are not an HTTP/1.1 response."""


class HttpPool:
    """Connections to one origin (scheme, host, port); share one per upstream address."""

    __slots__ = ("_connect_timeout", "_idle", "_keepalive", "_prefix", "_ssl", "host", "origin", "port", "timers")

    def __init__(self, url: str, *, connect_timeout: float = 10.0, keepalive_seconds: float = 4.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        secure = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if secure else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_seconds
        self._idle: deque[_Connection] = deque()
        self.timers = CoarseTimers(_TIMER_RESOLUTION)
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = self.port == (443 if secure else 80)
        self.origin = host if default_port else f"{host}:{self.port}"
        self._prefix = f" HTTP/1.1\r\nHost: {self.origin}\r\n".encode("latin-1")

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes, timeout: float
    ) -> Response:
        """Send one request; return once the answer's head arrived (within `timeout`)."""
        lines = [method.encode("ascii"), b" ", path.encode("ascii"), self._prefix]
        for name, value in headers.items():
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(b"Content-Length: %d\r\n\r\n" % len(body))
        lines.append(body)
        data = b"".join(lines)
        reused = self._take_idle()
        if reused is not None:
            try:
                return await _exchange(reused, data, timeout)
            except ConnectionBroken as exc:
                if not exc.before_answer:
                    raise
                # The server closed the idle connection as we sent: send again, once, fresh.
        return await _exchange(await self._connect(), data, timeout)

    def close(self) -> None:
        """Close the idle connections (those in use close when their answers end)."""
        while self._idle:
            self._idle.pop().abort()

    def _take_idle(self) -> _Connection | None:
        idle, deadline = self._idle, time.monotonic() - self._keepalive
        while idle:
            conn = idle.pop()
            if conn.idle_since >= deadline and not conn.closed:
                return conn
            conn.abort()
        return None

    def _give_back(self, conn: _Connection) -> None:
        idle = self._idle
        conn.idle_since = now = time.monotonic()
        idle.append(conn)
        deadline = now - self._keepalive
        while idle[0].idle_since < deadline:  # the oldest idled too long: close it now
            idle.popleft().abort()

    def _forget(self, conn: _Connection) -> None:
        try:
            self._idle.remove(conn)
        except ValueError:
            pass

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl
                )
        except TimeoutError as exc:
            raise ConnectTimedOut(f"connect to {self.origin} timed out") from exc
        except OSError as exc:  # refused, unresolvable, and every ssl.SSLError (a subclass)
            raise ConnectFailed(f"cannot connect to {self.origin}: {exc}") from exc
        return conn


async def _exchange(conn: _Connection, data: bytes, timeout: float) -> Response:
    """Send one request on `conn`; the response once its head arrived. A failure that left
    the connection open (a timeout, a cancellation) aborts it: it cannot be reused."""
    response = conn.send(data)
    try:
        await response.wait_head(timeout)
    except BaseException:
        conn.abort()
        raise
    return response


class _Connection(asyncio.Protocol):
    """One socket; answers are parsed by httptools into the current `Response`."""

    __slots__ = ("_parser", "_pool", "closed", "idle_since", "response", "transport")

    def __init__(self, pool: HttpPool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.closed = False
        self.idle_since = 0.0

    def send(self, data: bytes) -> Response:
        assert self.transport is not None and self.response is None
        self.response = response = Response(self)
        self.transport.write(data)
        return response

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass; both set TCP_NODELAY

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        response.received = True  # even a partial head: the server acted on the request, never resend it
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken(MalformedResponse("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._broken(MalformedResponse(f"malformed HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool._forget(self)
        response = self.response
        if response is not None:
            self.response = None
            response._connection_lost(exc)

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self.response is None:  # a second answer to one request
            raise MalformedResponse("unsolicited bytes after the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        assert response is not None
        size = len(name)
        if size == 12 and name.lower() == b"content-type":
            response.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
        elif (size == 14 and name.lower() == b"content-length") or (
            size == 17 and name.lower() == b"transfer-encoding"
        ):
            response.framed = True

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status = self._parser.get_status_code()
        response._head_arrived()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        assert response is not None
        if response.status < 200:  # an interim 1xx answer: the real one follows
            response.status = 0
            response.content_type = ""
            return
        self.response = None
        keep = self._parser.should_keep_alive()
        response._complete()
        if keep and not self.closed:
            if response._paused:
                assert self.transport is not None
                self.transport.resume_reading()
            self._pool._give_back(self)
        else:
            self.abort()

    def _broken(self, error: TransportError) -> None:
        response, self.response = self.response, None
        self.abort()
        if response is not None:
            response._fail(error)


class Response:
    """An answer being received: status and content type once the head arrived, then the body's
    bytes through `read()` / `read_all()`. `close()` before the end aborts the connection."""

    __slots__ = (
        "_buffered", "_chunks", "_conn", "_done", "_error", "_paused", "_timers", "_waiter", "content_type",
        "framed", "received", "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self._timers = conn._pool.timers
        self.status = 0
        self.content_type = ""
        self.received = False  # any byte of the answer arrived
        self.framed = False  # a Content-Length or Transfer-Encoding: else the body ends with the connection
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._error: TransportError | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def complete(self) -> bool:
        return self._done

    async def wait_head(self, timeout: float) -> None:
        while not self.status and self._error is None:
            await self._wait(timeout, "sent no response")
        if self._error is not None:
            raise self._error

    async def read(self, timeout: float) -> bytes:
        """The bytes that arrived since the last read, waiting up to `timeout` s for some;
        b"" at the end of the body."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait(timeout, "sent nothing")
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            conn = self._conn
            if conn is not None and conn.transport is not None and not conn.closed:
                conn.transport.resume_reading()
        return data

    async def read_all(self, timeout: float) -> bytes:
        """The rest of the body; `timeout` bounds each wait for more bytes."""
        parts = []
        while data := await self.read(timeout):
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Done with this answer: abort the connection unless the body already ended."""
        conn, self._conn = self._conn, None
        if not self._done and conn is not None:
            conn.response = None
            conn.abort()
        self._done = True
        self._chunks.clear()

    async def _wait(self, timeout: float, what: str) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        timer = self._timers.call_later(timeout, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise ResponseTimedOut(f"upstream {what} for {timeout:g}s") from None
        except asyncio.CancelledError:
            self.close()  # the reader gave up mid-answer: the connection cannot be reused
            raise
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # called by the connection

    def _head_arrived(self) -> None:
        if self.status >= 200:
            self._wake()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused:
            conn = self._conn
            if conn is not None and conn.transport is not None:
                self._paused = True
                conn.transport.pause_reading()
        self._wake()

    def _complete(self) -> None:
        self._done = True
        self._conn = None
        self._wake()

    def _fail(self, error: TransportError) -> None:
        self._error = error
        self._conn = None
        self._wake()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._done:
            return
        reason = f": {exc}" if exc is not None else ""
        if self.status and not self.framed and exc is None:
            # httptools has no end-of-input call: an unframed body (HTTP/1.0 style) ends
            # with the connection, and a clean close is its end.
            self._complete()
            return
        self._fail(ConnectionBroken(f"the upstream closed the connection{reason}", before_answer=not self.received))


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
