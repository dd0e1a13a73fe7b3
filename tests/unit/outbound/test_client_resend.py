"""The one resend: a POST that meets a reused keep-alive connection the upstream closed or
reset before answering (the keep-alive race) is sent again once; nothing else is.

The server is a raw asyncio one on 127.0.0.1 that writes exact HTTP bytes, so a test
decides what each request on each connection gets."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from domain.canonical import ChatRequest, Message, TextPart
from domain.errors import UpstreamError, UpstreamUnavailable

COMPLETION = (
    b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(COMPLETION), COMPLETION,
)

CUT = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"


@dataclass
class Server:
    """Answers request n on connection c with `script[c, n]`: bytes to send, or "close", "reset"
    or "cut" (part of an answer, then close); a complete answer by default."""

    script: dict[tuple[int, int], bytes | str] = field(default_factory=dict)
    requests: list[tuple[int, int]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn, self.connections = self.connections, self.connections + 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
                self.bodies.append(await reader.readexactly(int(length[1]) if length else 0))
                self.requests.append((conn, n))
                action = self.script.get((conn, n), ANSWER)
                if action == "reset":  # RST instead of FIN
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if action == "cut":  # the head and a byte of the body, then FIN
                    writer.write(CUT)
                    break
                if action == "close":
                    break
                assert isinstance(action, bytes)
                writer.write(action)
                await writer.drain()
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    async with await asyncio.start_server(state.serve, "127.0.0.1", 0) as listener:
        state.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        yield state


@pytest.fixture
async def client(server: Server) -> AsyncIterator[OpenAICompatClient]:
    sessions = {"up": upstream_session(server.url)}
    yield OpenAICompatClient(sessions, name="up", base_url=server.url, connect_timeout=2, first_byte_timeout=2,
                             idle_timeout=2)
    await sessions["up"].close()


def request() -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])])


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_reused_connection_dead_before_the_answer_is_resent_once(
    server: Server, client: OpenAICompatClient, how: str
) -> None:
    server.script[(0, 1)] = how  # the second request on the first connection: the keep-alive race
    await client.complete(request())
    response = await client.complete(request())
    assert response.content == [TextPart(text="ok")]
    assert server.requests == [(0, 0), (0, 1), (1, 0)]  # sent again, once, on a new connection
    assert server.bodies[2] == server.bodies[1]


async def test_a_new_connection_that_dies_before_answering_is_not_resent(
    server: Server, client: OpenAICompatClient
) -> None:
    server.script[(0, 0)] = "close"
    with pytest.raises(UpstreamUnavailable):
        await client.complete(request())
    assert server.requests == [(0, 0)]


async def test_the_resend_happens_only_once(server: Server, client: OpenAICompatClient) -> None:
    await asyncio.gather(client.complete(request()), client.complete(request()))  # two pooled connections
    server.script.update({(0, 1): "close", (1, 1): "close"})  # both die when next used
    with pytest.raises(UpstreamUnavailable):
        await client.complete(request())
    assert sorted(server.requests) == [(0, 0), (0, 1), (1, 0), (1, 1)] and server.connections == 2


async def test_an_answer_cut_after_its_head_is_not_resent(server: Server, client: OpenAICompatClient) -> None:
    server.script[(0, 1)] = "cut"
    await client.complete(request())
    with pytest.raises(UpstreamError, match="mid-answer"):
        await client.complete(request())
    assert server.requests == [(0, 0), (0, 1)]


async def test_a_pooled_connection_another_caller_opened_counts_as_reused(server: Server) -> None:
    session = upstream_session(server.url)
    client = OpenAICompatClient({"up": session}, name="up", base_url=server.url, connect_timeout=2,
                                first_byte_timeout=2, idle_timeout=2)
    try:
        async with session.post(server.url + "/v1/chat/completions", data=b"{}") as resp:  # not the client's
            await resp.read()
        server.script[(0, 1)] = "close"  # the client's call meets that connection dead
        response = await client.complete(request())
        assert response.content == [TextPart(text="ok")]
        assert server.requests == [(0, 0), (0, 1), (1, 0)]
    finally:
        await session.close()
