"""The guarded uvicorn protocol keeps uvicorn's keep-alive behaviour on its coarse timers:
an idle connection is closed after `timeout_keep_alive`, a busy one is not."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from adapters.inbound._shared.http_guard import guarded_protocol

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=free, lifespan="off", log_level="warning",
                            http=guarded_protocol(64 * 1024, 5.0), timeout_keep_alive=0.4)  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):  # up to 5 s
        if server.started:
            break
        await asyncio.sleep(0.01)
    yield free
    server.should_exit = True
    await asyncio.wait_for(task, 5)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(REQUEST)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200")
    return await asyncio.wait_for(reader.readexactly(2), 2)


async def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await exchange(reader, writer) == b"ok"
    began = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(reader.read(1), 3) == b""  # closed by the server
    waited = asyncio.get_running_loop().time() - began
    assert 0.4 <= waited <= 0.4 + 0.25 + 0.3  # timeout + coarse resolution + slack
    writer.close()


async def test_requests_within_the_timeout_keep_the_connection(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(4):  # 4 x 0.2 s: longer than one timeout in all, never idle for one
        assert await exchange(reader, writer) == b"ok"
        await asyncio.sleep(0.2)
    assert await exchange(reader, writer) == b"ok"
    writer.close()
