"""The guarded uvicorn protocol, on a real uvicorn server over loopback: a head that keeps
growing gets a plain-text 431, one that never completes a plain-text 408 (timed from the
connection's opening or the request's first byte), uvicorn's own keep-alive timeout
still closes idle connections between requests, and a client that stops reading is dropped
after the write timeout (the app sees a disconnect) while a slow one that reads is not."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from adapters.inbound._shared.call import BODY_RECEIVED, HANG_UP_NOTICE
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound._shared.http_guard import guarded_protocol

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
MAX_BYTES = 2048


ENDINGS: list[asyncio.Queue[str]] = []  # the running test's queue: how each /stream request ended


def endings() -> asyncio.Queue[str]:
    ENDINGS[:] = [asyncio.Queue()]
    return ENDINGS[0]
CHUNK = b"x" * 65536
BIG = 8 * 1024 * 1024


async def waiting(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A handler that waits with nothing sent (as a queued request does), watched for a hang-up."""
    call = scope["state"]["gateway.call"]
    call.watch()
    try:
        await asyncio.sleep(0.05)  # past the receive watcher's start (5 ms) under another server
        watchers = [t for t in asyncio.all_tasks() if "Call._watch" in repr(t.get_coro())]
        ENDINGS[0].put_nowait(f"noticed={HANG_UP_NOTICE in scope['state']} watchers={len(watchers)}")
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        ENDINGS[0].put_nowait("cancelled")
        raise
    ENDINGS[0].put_nowait("not cancelled")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    if scope["path"] == "/body":  # whether the server said the body was all there, before and after reading it
        before = BODY_RECEIVED in scope["state"]
        while (await receive()).get("more_body"):
            pass
        answer = b"%d%d" % (before, BODY_RECEIVED in scope["state"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": answer})
        return
    if scope["path"] == "/wait":
        await EdgeMiddleware(waiting)(scope, receive, send)
        return
    if scope["path"] == "/stream":  # 64 KiB chunks for 5 s, unless the client goes away
        await stream(receive, send)
        return
    if scope["path"] == "/big":  # 8 MiB in one send: far more than the socket buffers take
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % BIG)]})
        await send({"type": "http.response.body", "body": b"x" * BIG})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def stream(receive: Any, send: Any) -> None:
    await receive()  # the (empty) body
    gone = asyncio.ensure_future(receive())  # http.disconnect, once the connection is lost
    await send({"type": "http.response.start", "status": 200, "headers": []})
    loop = asyncio.get_running_loop()
    end = loop.time() + 5.0
    while loop.time() < end and not gone.done():
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    if gone.done():
        ENDINGS[0].put_nowait("disconnect")
        return
    gone.cancel()
    ENDINGS[0].put_nowait("complete")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[float, float], Awaitable[int]]]:
    """`await serve(head_timeout, keep_alive[, write_timeout])` starts a server and gives its port."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(head_timeout: float, keep_alive: float, write_timeout: float = 30.0) -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = int(probe.getsockname()[1])
        config = uvicorn.Config(app, host="127.0.0.1", port=free, lifespan="off", log_level="warning",
                                http=guarded_protocol(MAX_BYTES, head_timeout, write_timeout),
                                timeout_keep_alive=keep_alive)
        server = uvicorn.Server(config)
        servers.append((server, asyncio.create_task(server.serve())))
        for _ in range(500):  # up to 5 s
            if server.started:
                break
            await asyncio.sleep(0.01)
        return free

    yield start
    for server, task in servers:
        server.should_exit = True
        await asyncio.wait_for(task, 5)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(REQUEST)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200")
    return await asyncio.wait_for(reader.readexactly(2), 2)


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(serve: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 0.4))
    assert await exchange(reader, writer) == b"ok"
    began = now()
    assert await asyncio.wait_for(reader.read(1), 3) == b""  # closed by the server, without an answer
    assert 0.4 <= now() - began <= 0.4 + 0.5  # uvicorn's loop timer + slack for a busy machine
    writer.close()


async def test_requests_within_the_timeout_keep_the_connection(serve: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 0.4))
    for _ in range(4):  # 4 x 0.2 s: longer than one timeout in all, never idle for one
        assert await exchange(reader, writer) == b"ok"
        await asyncio.sleep(0.2)
    assert await exchange(reader, writer) == b"ok"
    writer.close()


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 5)


@pytest.mark.parametrize("start", [b"", b"GET / HTTP/1.1\r\n"], ids=["idle-connection", "slow-head"])
async def test_a_head_not_complete_in_time_gets_a_plain_408(serve: Any, start: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(0.5, 5.0))
    began = now()
    writer.write(start)
    received = await read_all(reader)
    assert 0.5 <= now() - began <= 0.5 + 0.5
    assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received
    assert b"content-type: text/plain; charset=utf-8\r\n" in received and b"connection: close\r\n" in received
    writer.close()


async def test_the_next_head_is_timed_from_its_first_byte_not_the_idle_time_before(serve: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(0.5, 5.0))
    assert await exchange(reader, writer) == b"ok"
    await asyncio.sleep(0.8)  # idle between requests: uvicorn's keep-alive, not the head bound
    assert await exchange(reader, writer) == b"ok"
    await _head_times_out_after(reader, writer, 0.5)


async def _head_times_out_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float) -> None:
    """A head begun now and never finished gets a 408 `seconds` after its first byte."""
    writer.write(b"GET / HTTP/1.1\r\n")
    began = now()
    received = await read_all(reader)
    assert seconds - 0.05 <= now() - began <= seconds + 0.5
    assert received.startswith(b"HTTP/1.1 408 "), received
    writer.close()


async def test_a_head_begun_while_the_last_ones_timer_is_still_set_gets_its_whole_time(serve: Any) -> None:
    # One timer per connection: set at the opening (for 0.5 s), still set when the next head
    # begins 0.3 s later; that head is timed from its own first byte, not cut at 0.5 s.
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(0.5, 5.0))
    assert await exchange(reader, writer) == b"ok"
    await asyncio.sleep(0.3)
    await _head_times_out_after(reader, writer, 0.5)


async def test_a_head_that_keeps_growing_gets_a_plain_431(serve: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 5.0))
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n")
    received = b""
    for _ in range(20):  # one header line per read until the server answers; 3 are past MAX_BYTES
        writer.write(b"x-a: " + b"a" * 1000 + b"\r\n")
        try:
            received = await asyncio.wait_for(reader.read(65536), 0.3)
            break
        except TimeoutError:
            continue
    received += await read_all(reader)
    assert received.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), received
    assert received.endswith(b"\r\n\r\nRequest headers too large.")
    writer.close()


async def test_a_large_head_that_arrives_whole_reaches_the_app(serve: Any) -> None:
    # Not counted by the protocol: the app's own header limit answers it in the surface's shape.
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 5.0))
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * (3 * MAX_BYTES) + b"\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200")
    writer.close()


async def stalled_reader(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a tiny window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
    return reader, writer


async def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout(serve: Any) -> None:
    ends = endings()
    _, writer = await stalled_reader(await serve(5.0, 5.0, 0.5))
    began = now()
    # never reads: the server's writes stall, and the app sees the connection end before its 5 s
    assert await asyncio.wait_for(ends.get(), 4.0) == "disconnect"
    assert now() - began < 0.5 + 2.0  # filling the socket buffers, then the timeout
    writer.close()


async def test_a_slow_reader_that_keeps_reading_is_not_dropped(serve: Any) -> None:
    ends = endings()
    reader, writer = await stalled_reader(await serve(5.0, 5.0, 0.5))
    received = 0
    while ends.empty():  # slower than the app writes, but never 0.5 s without progress
        received += len(await asyncio.wait_for(reader.read(65536), 2))
        await asyncio.sleep(0.01)
    assert ends.get_nowait() == "complete" and received > 0
    writer.close()


async def test_a_large_answer_read_slowly_but_steadily_is_not_dropped(serve: Any) -> None:
    """Writing stays paused for longer than the timeout (the answer takes 2.6 s to read), but
    the client takes in part of it in every timeout: it is reading, not stalled. (On loopback
    the kernel's send buffer grows to 4 MB and frees space in 2 MB steps: the timeout here must
    be longer than one step takes.)"""
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 5.0, 1.0))
    writer.write(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200")
    received = 0
    while chunk := await asyncio.wait_for(reader.read(65536), 2):  # at most 3.2 MB/s
        received += len(chunk)
        if received == BIG:
            break
        await asyncio.sleep(0.02)
    assert received == BIG
    writer.close()


async def test_a_hang_up_while_nothing_was_sent_cancels_the_watched_request_at_once(serve: Any) -> None:
    """The protocol tells the edge when the connection is lost: no task per request waits on
    `receive()` for it, and the waiting handler is cancelled (its slot freed) at once."""
    ended = endings()
    _reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 5.0))
    writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(ended.get(), 2) == "noticed=True watchers=0"
    began = now()
    writer.close()
    assert await asyncio.wait_for(ended.get(), 2) == "cancelled"
    assert now() - began < 0.5


async def test_a_body_that_came_whole_is_marked_received_and_a_late_one_only_once_complete(serve: Any) -> None:
    """The edge reads a body the server says is all there without a timer (`read_body`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", await serve(5.0, 5.0))
    head = b"POST /body HTTP/1.1\r\nHost: x\r\ncontent-length: 4\r\n\r\n"
    writer.write(head + b"abcd")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)).startswith(b"HTTP/1.1 200")
    assert await asyncio.wait_for(reader.readexactly(2), 2) == b"11"
    writer.write(head + b"ab")  # half the body, the rest later
    await asyncio.sleep(0.1)
    writer.write(b"cd")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert await asyncio.wait_for(reader.readexactly(2), 2) == b"01"
    writer.close()
