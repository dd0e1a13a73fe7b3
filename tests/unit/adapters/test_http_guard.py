"""The guarded uvicorn protocol, on a real uvicorn server over loopback: a head that keeps
growing gets a plain-text 431, one that never completes a plain-text 408 (timed from the
connection's opening or the request's first byte), and uvicorn's own keep-alive timeout
still closes idle connections between requests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from adapters.inbound._shared.http_guard import guarded_protocol

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
MAX_BYTES = 2048


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[float, float], Awaitable[int]]]:
    """`await serve(head_timeout, keep_alive)` starts a server and gives its port."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(head_timeout: float, keep_alive: float) -> int:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = int(probe.getsockname()[1])
        config = uvicorn.Config(app, host="127.0.0.1", port=free, lifespan="off", log_level="warning",
                                http=guarded_protocol(MAX_BYTES, head_timeout), timeout_keep_alive=keep_alive)
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
    writer.write(b"GET / HTTP/1.1\r\n")
    began = now()
    received = await read_all(reader)
    assert 0.5 - 0.05 <= now() - began <= 0.5 + 0.5
    assert received.startswith(b"HTTP/1.1 408 "), received
    writer.close()


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
