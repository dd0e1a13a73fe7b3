"""`HttpPool` against scripted servers on 127.0.0.1 that write exact raw HTTP bytes.

Each test gives the server a script: a coroutine run once per accepted connection (a `Peer`).
The server records the connections and the requests it received, so a test can tell whether
the pool reused a connection, sent a request again, or closed a connection.
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from adapters.outbound.http_pool import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    HttpPool,
    MalformedResponse,
    Response,
    ResponseTimedOut,
)

WAIT = 2.0  # bound for anything the test waits on that should happen at once
T = TypeVar("T")


def within(aw: Awaitable[T], seconds: float = WAIT) -> Awaitable[T]:
    return asyncio.wait_for(aw, seconds)


def answer(body: bytes = b"", status: str = "200 OK", headers: str = "Content-Type: text/plain\r\n") -> bytes:
    """A complete keep-alive answer framed by Content-Length."""
    return b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s" % (status.encode(), headers.encode(), len(body), body)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class Peer:
    """One connection the scripted server accepted."""

    def __init__(self, server: ScriptedServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.index = len(server.peers)
        self.reader = reader
        self.writer = writer
        self.gone = asyncio.Event()  # the client closed or reset the connection

    async def request(self) -> bytes:
        """The next request (head and body), or b"" once the client closed the connection."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
            body = await self.reader.readexactly(int(length[1])) if length else b""
        except (asyncio.IncompleteReadError, ConnectionError):
            self.gone.set()
            return b""
        self.server.requests.append(head + body)
        return head + body

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        """Close cleanly (FIN) once what was sent is flushed."""
        self.writer.close()

    def reset(self) -> None:
        """Close with a TCP RST."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Script = Callable[[Peer], Awaitable[None]]


class ScriptedServer:
    """Runs `script` for each connection; records the connections and the requests received."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.peers: list[Peer] = []
        self.requests: list[bytes] = []
        self.errors: list[BaseException] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pools: list[HttpPool] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def pool(self, **kw: float) -> HttpPool:
        pool = HttpPool(self.url, **({"connect_timeout": WAIT} | kw))
        self._pools.append(pool)
        return pool

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(self, reader, writer)
        self.peers.append(peer)
        try:
            await self.script(peer)
        except ConnectionError:
            pass  # the client went away while the script wrote
        except Exception as exc:  # surfaced by the fixture: a script bug must not pass silently
            self.errors.append(exc)

    async def stop(self) -> None:
        for pool in self._pools:
            pool.close()
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for peer in self.peers:
            peer.writer.transport.abort()
        await self._server.wait_closed()
        await asyncio.sleep(0)  # let the client side's connection_lost run


Serve = Callable[[Script], Awaitable[ScriptedServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """`await serve(script)`: a started server; stopped, and its pools closed, after the test."""
    servers: list[ScriptedServer] = []

    async def start(script: Script) -> ScriptedServer:
        server = ScriptedServer(script)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
    for server in servers:
        assert not server.errors, server.errors


def answer_each(data: bytes) -> Script:
    """Answer every request on every connection with `data`."""

    async def script(peer: Peer) -> None:
        while await peer.request():
            peer.send(data)

    return script


# The pool's own timeouts bound its waits; `within` bounds them again so that a broken timer fails the
# test instead of hanging it.


async def get(pool: HttpPool, path: str = "/", timeout: float = WAIT) -> Response:
    return await within(pool.request("GET", path, {}, b"", timeout), timeout + WAIT)


async def read(resp: Response, timeout: float = WAIT) -> bytes:
    return await within(resp.read(timeout), timeout + WAIT)


async def read_all(resp: Response) -> bytes:
    return await within(resp.read_all(WAIT), 5 * WAIT)


async def get_body(pool: HttpPool, path: str = "/") -> bytes:
    resp = await get(pool, path)
    try:
        return await read_all(resp)
    finally:
        resp.close()


# --- the request, framing and reuse


async def test_content_length_answer_and_connection_reuse(serve: Serve) -> None:
    content_type = "Content-Type: Application/JSON; charset=utf-8\r\n"
    server = await serve(answer_each(answer(b'{"ok": true}', headers=content_type)))
    pool = server.pool()

    resp = await within(pool.request("POST", "/v1/chat/completions", {"Authorization": "Bearer k"}, b'{"a": 1}', WAIT))
    assert (resp.status, resp.content_type) == (200, "application/json")
    assert await read_all(resp) == b'{"ok": true}'
    assert resp.complete
    assert await get_body(pool, "/again") == b'{"ok": true}'

    assert len(server.peers) == 1  # the second request went over the same connection
    port = server.url.rsplit(":", 1)[1]
    assert server.requests == [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nAuthorization: Bearer k\r\n"
        b'Content-Length: 8\r\n\r\n{"a": 1}' % port.encode(),
        b"GET /again HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nContent-Length: 0\r\n\r\n" % port.encode(),
    ]


async def test_chunked_answer_read_piecewise(serve: Serve) -> None:
    step = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        for piece in (chunk(b"data: two\n\n"), LAST_CHUNK):
            await step.wait()  # the next piece only once the client read the previous one
            step.clear()
            peer.send(piece)
        await answer_each(answer(b"next"))(peer)

    server = await serve(script)
    pool = server.pool()
    resp = await get(pool)
    assert (resp.status, resp.content_type) == (200, "text/event-stream")
    assert await read(resp) == b"data: one\n\n"
    step.set()
    assert await read(resp) == b"data: two\n\n"
    step.set()
    assert await read(resp) == b""
    assert resp.complete
    assert await read(resp) == b""  # still the end

    assert await get_body(pool) == b"next"
    assert len(server.peers) == 1


async def test_connection_close_answer_is_not_reused(serve: Serve) -> None:
    # The server does not close on its own: the client must close after the answer.
    server = await serve(answer_each(answer(b"bye", headers="Connection: close\r\n")))
    pool = server.pool()
    assert await get_body(pool) == b"bye"
    await within(server.peers[0].gone.wait())
    assert await get_body(pool) == b"bye"
    assert len(server.peers) == 2


async def test_answer_without_body_keeps_the_connection(serve: Serve) -> None:
    # 204 has no body by definition, even without a Content-Length.
    server = await serve(answer_each(b"HTTP/1.1 204 No Content\r\n\r\n"))
    pool = server.pool()
    for _ in range(2):
        resp = await get(pool)
        assert resp.status == 204
        assert await read_all(resp) == b""
    assert len(server.peers) == 1


async def test_pool_close_closes_idle_connections(serve: Serve) -> None:
    server = await serve(answer_each(answer(b"x")))
    pool = server.pool()
    await get_body(pool)
    pool.close()
    await within(server.peers[0].gone.wait())


# --- the keep-alive race: a reused connection closed by the server


@pytest.mark.parametrize("when", ["idle", "on_next_request"])
async def test_reused_connection_closed_by_server_is_replaced(serve: Serve, when: str) -> None:
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            peer.send(answer(b"first"))
            if when == "on_next_request":
                await peer.request()  # the request arrives, the server closes without a byte of answer
            peer.close()
        else:
            await answer_each(answer(b"second"))(peer)

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    assert await get_body(pool) == b"second"
    assert len(server.peers) == 2


async def test_reused_connection_reset_before_answer_is_retried(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            peer.send(answer(b"first"))
            await peer.request()
            peer.reset()
        else:
            await answer_each(answer(b"second"))(peer)

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    assert await get_body(pool) == b"second"
    assert len(server.requests) == 3  # the second request was sent twice, once per connection


async def test_retry_is_only_once(serve: Serve) -> None:
    # Every connection is closed when its second request arrives: the fresh connection of the retry
    # also fails, and that failure is final.
    async def script(peer: Peer) -> None:
        await peer.request()
        if peer.index == 0:
            peer.send(answer(b"first"))
            await peer.request()
        peer.close()

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    with pytest.raises(ConnectionBroken) as caught:
        await get(pool)
    assert caught.value.before_answer
    assert (len(server.peers), len(server.requests)) == (2, 3)


async def test_fresh_connection_closed_before_answer_is_not_retried(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.close()

    server = await serve(script)
    with pytest.raises(ConnectionBroken) as caught:
        await get(server.pool())
    assert caught.value.before_answer
    assert len(server.requests) == 1


async def test_answer_cut_after_its_head_is_not_retried(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(answer(b"first"))
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        peer.close()

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    resp = await get(pool)
    assert resp.status == 200
    with pytest.raises(ConnectionBroken) as caught:
        await read_all(resp)
    assert not caught.value.before_answer
    assert (len(server.peers), len(server.requests)) == (1, 2)


@pytest.mark.parametrize(
    "partial",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Ty"],
    ids=["after_an_interim_answer", "inside_its_head"],
)
async def test_answer_cut_early_is_not_retried(serve: Serve, partial: bytes) -> None:
    # The server began to answer, so it did act on the request: sending it again would run it twice.
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            peer.send(answer(b"first"))
            await peer.request()
            peer.send(partial)
            peer.close()
        else:
            await answer_each(answer(b"again"))(peer)

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    with pytest.raises(ConnectionBroken) as caught:
        await get(pool)
    assert not caught.value.before_answer
    assert (len(server.peers), len(server.requests)) == (1, 2)


# --- idle connections


async def test_idle_connection_expires(serve: Serve) -> None:
    server = await serve(answer_each(answer(b"x")))
    pool = server.pool(keepalive_seconds=0.2)
    await get_body(pool)
    await get_body(pool)
    assert len(server.peers) == 1  # within keepalive_seconds: reused
    await asyncio.sleep(0.3)
    await get_body(pool)
    assert len(server.peers) == 2
    await within(server.peers[0].gone.wait())  # the expired one is closed, not left open


def slow_and_fast(step: asyncio.Event) -> Script:
    """GET /slow: the head at once, the body once `step` is set. Else: an answer naming the connection."""

    async def script(peer: Peer) -> None:
        while request := await peer.request():
            if request.startswith(b"GET /slow "):
                peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
                await step.wait()
                peer.send(b"slow")
            else:
                peer.send(answer(b"peer %d" % peer.index))

    return script


async def test_most_recently_used_connection_first(serve: Serve) -> None:
    step = asyncio.Event()
    server = await serve(slow_and_fast(step))
    pool = server.pool()
    slow = await get(pool, "/slow")  # peer 0, busy
    assert await get_body(pool) == b"peer 1"  # peer 1 idles from here
    step.set()
    assert await read_all(slow) == b"slow"  # peer 0 idles from here
    assert await get_body(pool) == b"peer 0"
    assert await get_body(pool) == b"peer 0"
    assert len(server.peers) == 2


async def test_expired_idle_connection_closed_when_another_is_given_back(serve: Serve) -> None:
    step = asyncio.Event()
    server = await serve(slow_and_fast(step))
    pool = server.pool(keepalive_seconds=0.2)
    slow = await get(pool, "/slow")
    assert await get_body(pool) == b"peer 1"
    await asyncio.sleep(0.3)
    step.set()
    assert await read_all(slow) == b"slow"
    await within(server.peers[1].gone.wait())  # no request needed the pool for peer 1 to be closed


# --- timeouts and connect failures


async def test_head_not_sent_in_time(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            await peer.request()  # no answer; wait for the client to give up
        else:
            await answer_each(answer(b"x"))(peer)

    server = await serve(script)
    pool = server.pool()
    with pytest.raises(ResponseTimedOut):
        await get(pool, timeout=0.2)
    await within(server.peers[0].gone.wait())
    assert await get_body(pool) == b"x"
    assert len(server.peers) == 2


async def test_body_stalls(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await peer.request()

    server = await serve(script)
    resp = await get(server.pool())
    assert await read(resp) == b"0123456789"
    with pytest.raises(ResponseTimedOut):
        await read(resp, 0.2)
    resp.close()
    await within(server.peers[0].gone.wait())


async def test_connect_refused() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectFailed):
        await get(HttpPool(f"http://127.0.0.1:{port}", connect_timeout=WAIT))


async def test_connect_timeout() -> None:
    # A listener whose accept queue is full drops new SYNs: the connect hangs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = [socket.socket() for _ in range(3)]
    try:
        for sock in fillers:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        with pytest.raises(ConnectTimedOut):
            await get(HttpPool(f"http://127.0.0.1:{port}", connect_timeout=0.2))
    finally:
        for sock in [*fillers, listener]:
            sock.close()


# --- ending an answer early


async def test_close_before_the_end_aborts_the_connection(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
            await peer.request()
        else:
            await answer_each(answer(b"x"))(peer)

    server = await serve(script)
    pool = server.pool()
    resp = await get(pool)
    assert await read(resp) == b"data: one\n\n"
    resp.close()
    await within(server.peers[0].gone.wait())
    assert await read(resp) == b""
    assert await get_body(pool) == b"x"
    assert len(server.peers) == 2


async def test_cancel_while_waiting_for_the_head(serve: Serve) -> None:
    arrived = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        arrived.set()
        await peer.request()

    server = await serve(script)
    task = asyncio.create_task(get(server.pool(), timeout=10))
    await within(arrived.wait())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task)
    await within(server.peers[0].gone.wait())


async def test_cancel_while_reading_the_body(serve: Serve) -> None:
    # The way the gateway reads: the response is closed in `finally`, so cancelling aborts.
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(CHUNKED_HEAD + chunk(b"data: one\n\n"))
        await peer.request()

    server = await serve(script)
    pool = server.pool()
    got_some = asyncio.Event()

    async def stream() -> None:
        resp = await get(pool)
        try:
            while await read(resp, 10):
                got_some.set()
        finally:
            resp.close()

    task = asyncio.create_task(stream())
    await within(got_some.wait())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task)
    await within(server.peers[0].gone.wait())


# --- bodies that end with the connection


@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_unframed_body_ends_with_a_clean_close(serve: Serve, version: str) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/%s 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst part, " % version.encode())
        await asyncio.sleep(0.05)
        peer.send(b"second part")
        peer.close()

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first part, second part"
    assert await get_body(pool) == b"first part, second part"
    assert len(server.peers) == 2


async def test_unframed_body_cut_by_a_reset_is_an_error(serve: Serve) -> None:
    step = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        await step.wait()
        peer.reset()

    server = await serve(script)
    resp = await get(server.pool())
    step.set()
    with pytest.raises(ConnectionBroken) as caught:
        await read_all(resp)
    assert not caught.value.before_answer


# --- interim answers and malformed input


@pytest.mark.parametrize("together", [True, False], ids=["one_write", "two_writes"])
async def test_interim_answers_are_skipped(serve: Serve, together: bool) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nContent-Type: text/html\r\nLink: </a>\r\n\r\n"
    final = answer(b"done", status="201 Created", headers="")

    async def script(peer: Peer) -> None:
        await peer.request()
        if together:
            peer.send(interim + final)
        else:
            peer.send(interim)
            await asyncio.sleep(0.05)
            peer.send(final)
        await answer_each(answer(b"next"))(peer)

    server = await serve(script)
    pool = server.pool()
    resp = await get(pool)
    assert (resp.status, resp.content_type) == (201, "")  # nothing of the interim answers' heads
    assert await read_all(resp) == b"done"
    assert await get_body(pool) == b"next"
    assert len(server.peers) == 1


async def test_garbage_instead_of_http(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"SSH-2.0-OpenSSH_9.6\r\n")
        await peer.request()

    server = await serve(script)
    with pytest.raises(MalformedResponse):
        await get(server.pool())
    await within(server.peers[0].gone.wait())


async def test_switching_protocols_is_malformed(serve: Serve) -> None:
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        await peer.request()

    server = await serve(script)
    with pytest.raises(MalformedResponse):
        await get(server.pool())
    await within(server.peers[0].gone.wait())


@pytest.mark.parametrize("together", [True, False], ids=["one_write", "two_writes"])
async def test_bytes_after_the_answer_make_the_connection_unusable(serve: Serve, together: bool) -> None:
    step = asyncio.Event()

    async def script(peer: Peer) -> None:
        if peer.index == 0:
            await peer.request()
            if together:
                peer.send(answer(b"first") + b"surprise")
            else:
                peer.send(answer(b"first"))
                await step.wait()
                peer.send(b"surprise")
            await peer.request()
        else:
            await answer_each(answer(b"second"))(peer)

    server = await serve(script)
    pool = server.pool()
    assert await get_body(pool) == b"first"
    step.set()
    await within(server.peers[0].gone.wait())
    assert await get_body(pool) == b"second"
    assert len(server.peers) == 2


# --- large bodies and flow control


def pattern(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


async def test_large_chunked_body_read_slowly(serve: Serve) -> None:
    body = pattern(8 << 20)

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(CHUNKED_HEAD)
        for start in range(0, len(body), 64 << 10):
            peer.send(chunk(body[start : start + (64 << 10)]))
            await peer.writer.drain()
        peer.send(LAST_CHUNK)
        await answer_each(answer(b"next"))(peer)

    server = await serve(script)
    pool = server.pool()
    resp = await get(pool)
    parts = []
    while data := await read(resp):
        parts.append(data)
        await asyncio.sleep(0.002)
    assert b"".join(parts) == body
    assert await get_body(pool) == b"next"
    assert len(server.peers) == 1


async def test_reading_pauses_while_bytes_wait_unread(serve: Serve) -> None:
    body = pattern(32 << 20)
    sent = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(answer(body))
        await peer.writer.drain()
        sent.set()
        await answer_each(answer(b"next"))(peer)

    server = await serve(script)
    pool = server.pool()
    resp = await get(pool)
    await asyncio.sleep(0.3)
    # The client stopped reading: most of the body is still in the server's buffer, not the client's.
    assert not sent.is_set()
    assert server.peers[0].writer.transport.get_write_buffer_size() > 16 << 20
    assert await read_all(resp) == body
    await within(sent.wait())
    assert await get_body(pool) == b"next"
    assert len(server.peers) == 1


async def test_large_bodies_read_after_a_delay_are_complete(serve: Serve) -> None:
    # Around the pause threshold (1 MiB) the body often ends in the very bytes that paused the
    # reading: the connection must read again for its next answer.
    sizes = [(1 << 20) + delta for delta in (-4096, 0, 1, 60_000, 100_000, 200_000, 250_000)] + [8 << 20]
    bodies = {size: pattern(size, seed=size) for size in sizes}

    async def script(peer: Peer) -> None:
        for size in sizes:
            await peer.request()
            peer.send(answer(bodies[size]))
        await answer_each(answer(b"next"))(peer)

    server = await serve(script)
    pool = server.pool()
    for size in sizes:
        resp = await get(pool)
        await asyncio.sleep(0.1)  # the whole answer arrives (as far as unread bytes allow) before any read
        assert await read_all(resp) == bodies[size]
    assert await get_body(pool) == b"next"
    assert len(server.peers) == 1


# --- the pool's origin


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://example.com", "example.com"),
        ("http://example.com:80/v1", "example.com"),
        ("http://example.com:8000", "example.com:8000"),
        ("https://example.com:443", "example.com"),
        ("https://example.com:80", "example.com:80"),
        ("http://[::1]:8000", "[::1]:8000"),
    ],
)
def test_origin(url: str, origin: str) -> None:
    assert HttpPool(url).origin == origin


@pytest.mark.parametrize("url", ["ftp://example.com", "example.com:80", "http://"])
def test_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError):
        HttpPool(url)
