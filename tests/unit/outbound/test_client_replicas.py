"""Calls to a chosen replica: the request goes to that replica's address, on its own session,
and the one resend after a dead keep-alive connection goes to the same replica."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from tests.unit.outbound.test_client_resend import Server, request

from adapters.outbound.openai_compat import OpenAICompatClient, upstream_session
from adapters.outbound.openai_compat.replica_sessions import ReplicaSessions
from domain.canonical import TextPart

STREAM = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ))
    + b"0\r\n\r\n"
)  # fmt: skip


@pytest.fixture
async def replicas() -> AsyncIterator[list[Server]]:
    servers = [Server(), Server()]
    listeners = [await asyncio.start_server(s.serve, "127.0.0.1", 0) for s in servers]
    for server, listener in zip(servers, listeners, strict=True):
        server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    yield servers
    for listener in listeners:
        listener.close()


@pytest.fixture
async def pool() -> AsyncIterator[ReplicaSessions]:
    sessions = ReplicaSessions()
    yield sessions
    await sessions.close()


def client(pool: ReplicaSessions, sessions: dict[str, object] | None = None) -> OpenAICompatClient:
    # the upstream's own url answers nothing: every call here must go to a replica
    return OpenAICompatClient(sessions or {}, name="up", base_url="http://127.0.0.1:9", connect_timeout=2,  # type: ignore[arg-type]
                              first_byte_timeout=2, idle_timeout=2, replicas=pool)  # fmt: skip


async def test_each_call_goes_to_its_replica_on_that_replicas_session(
    replicas: list[Server], pool: ReplicaSessions
) -> None:
    up = client(pool)
    first, second = replicas
    second.script[(0, 0)] = STREAM
    answer = await up.complete(request(), replica=first.url)
    async with up.open_stream(request(), replica=second.url) as batches:
        chunks = [chunk async for batch in batches for chunk in batch]
    assert answer.content == [TextPart(text="ok")] and chunks
    assert (first.requests, second.requests) == ([(0, 0)], [(0, 0)])
    assert first.url in pool and second.url in pool and len(pool) == 2


async def test_the_resend_after_a_dead_keep_alive_goes_to_the_same_replica(
    replicas: list[Server], pool: ReplicaSessions
) -> None:
    up = client(pool)
    first, second = replicas
    first.script[(0, 1)] = "close"  # the keep-alive race on the first replica's pooled connection
    await up.complete(request(), replica=first.url)
    response = await up.complete(request(), replica=first.url)
    assert response.content == [TextPart(text="ok")]
    assert first.requests == [(0, 0), (0, 1), (1, 0)] and second.requests == []


async def test_a_replica_that_left_keeps_its_session_until_its_last_call_ends(
    replicas: list[Server], pool: ReplicaSessions
) -> None:
    up = client(pool)
    first, second = replicas
    second.script[(0, 0)] = STREAM
    await up.complete(request(), replica=first.url)
    async with up.open_stream(request(), replica=second.url) as batches:
        pool.retain(frozenset({second.url}))  # the first left discovery, unused: closed at once
        assert first.url not in pool
        pool.retain(frozenset({first.url}))  # the first is back, the second left while a stream reads it
        assert second.url in pool
        chunks = [chunk async for batch in batches for chunk in batch]
    assert chunks and second.url not in pool  # closed with its last call
    await up.complete(request(), replica=first.url)  # the one that came back gets a new session
    assert first.url in pool and first.connections == 2


async def test_without_a_replica_the_upstreams_own_session_and_url_are_used(pool: ReplicaSessions) -> None:
    server = Server()
    async with await asyncio.start_server(server.serve, "127.0.0.1", 0) as listener:
        server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        sessions = {"up": upstream_session(server.url)}
        up = OpenAICompatClient(sessions, name="up", base_url=server.url, replicas=pool)
        await up.complete(request())
        await sessions["up"].close()
    assert server.requests == [(0, 0)] and len(pool) == 0
