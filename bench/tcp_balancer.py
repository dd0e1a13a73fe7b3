"""A connection-level random TCP balancer on loopback: what kube-proxy's iptables mode does to a
ClusterIP Service (one backend picked at random per TCP connection, never per request).

    async with TcpBalancer(["127.0.0.1:8101", "127.0.0.1:8102"]) as lb:
        lb.url   # http://127.0.0.1:PORT: every new connection goes to a random backend

Bytes are copied both ways until either side closes; HTTP is never parsed, so every
request on a kept-alive connection goes where its connection went.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from types import TracebackType


class TcpBalancer:
    def __init__(self, backends: Sequence[str], *, seed: int | None = None, host: str = "127.0.0.1") -> None:
        self._backends = [_host_port(b) for b in backends]
        self._random = random.Random(seed)
        self._host = host
        self._server: asyncio.Server | None = None
        self._pipes: dict[asyncio.Task[None], tuple[asyncio.StreamWriter, ...]] = {}
        self.port = 0
        self.connections: dict[str, int] = {f"{h}:{p}": 0 for h, p in self._backends}  # backend -> connections

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def __aenter__(self) -> TcpBalancer:
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._server is not None:
            self._server.close()
        # Closing both ends ends the copies (a cancelled connection handler is logged as an error).
        for writers in list(self._pipes.values()):
            for w in writers:
                w.close()
        if self._pipes:
            await asyncio.wait(list(self._pipes), timeout=2)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self._random.choice(self._backends)
        self.connections[f"{host}:{port}"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._pipes[task] = (writer, up_writer)
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            self._pipes.pop(task, None)
            for w in (writer, up_writer):
                w.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("http://").rstrip("/").rpartition(":")
    return host, int(port)
