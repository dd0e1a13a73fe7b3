"""The container is the one composition root: it builds the Litestar app, and a provider
overridden there (a fake upstream client) is what the app's requests reach.

The dialects are registered through the container's `dialects` (bootstrap's `DIALECTS`),
each wrapped in a Router whose `before_request` hook counts: every `/v1` and `/llm`
request, plain and streamed, passes through Litestar's router and route handlers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from dependency_injector import providers
from litestar import Router
from litestar.testing import AsyncTestClient

import bootstrap
from adapters.inbound._shared.dialect import DialectRouter, EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from config import load_config_text
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    ChunkBatch,
    Finish,
    MessageStart,
    StreamChunk,
    TextDelta,
    TextPart,
    Usage,
    UsageReport,
)

CONFIG = """
[upstreams.up]
url = "http://127.0.0.1:9"
models = ["m"]
[upstreams.up.admission]
sequence_slots = 3
max_in_flight = 2
queue_depth = 2
queue_timeout_seconds = 5
"""
ANSWER = [
    StreamChunk(events=[MessageStart(id="chatcmpl-1", model="m", created=0)]),
    StreamChunk(events=[TextDelta(text="hello")]),
    StreamChunk(events=[Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=2, output_tokens=1))]),
]


class FakeUpstreamClient:
    """`ports.upstream.UpstreamClient` answering "hello" and noting every request."""

    def __init__(self) -> None:
        self.calls: list[ChatRequest] = []

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls.append(request)
        return ChatResponse(id="chatcmpl-1", model="m", created=0, content=[TextPart(text="hello")],
                            finish_reason="end_turn", usage=Usage(input_tokens=2, output_tokens=1))

    @asynccontextmanager
    async def open_stream(
        self, request: ChatRequest, heartbeat: float | None = None
    ) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        self.calls.append(request)

        async def batches() -> AsyncIterator[ChunkBatch]:
            for chunk in ANSWER:
                yield [chunk]

        yield batches()

    async def count_tokens(self, request: ChatRequest) -> int:
        return 2


def counted(dialect: DialectRouter, seen: Counter[str]) -> DialectRouter:
    """The dialect's Router inside one whose middleware counts each request (a middleware, not a
    `before_request` hook: Litestar runs only the closest layer's hook, the dialect Router's own)."""

    def count(app: Any) -> Any:
        async def counting(scope: Any, receive: Any, send: Any) -> None:
            seen[f"{scope['method']} {scope['path']}"] += 1
            await app(scope, receive, send)

        return counting

    def router(context: EdgeContext) -> Router:
        return Router(path="/", route_handlers=[dialect(context)], middleware=[count])

    return router


async def test_the_container_builds_the_app_and_its_overridden_upstream_serves_both_dialects() -> None:
    seen: Counter[str] = Counter()
    container = bootstrap.Container(
        config=load_config_text(CONFIG), dialects=[counted(d, seen) for d in bootstrap.DIALECTS]
    )
    fake = FakeUpstreamClient()
    container.upstreams.override(providers.Object({"up": fake}))
    app = container.app()
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    message = {**chat, "max_tokens": 8}
    async with AsyncTestClient(app) as client:
        plain = await client.post("/v1/chat/completions", json=chat)
        assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == "hello"
        stream = await client.post("/v1/chat/completions", json={**chat, "stream": True})
        assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n") and "hello" in stream.text
        plain = await client.post("/llm/v1/messages", json=message)
        assert plain.status_code == 200 and plain.json()["content"] == [{"type": "text", "text": "hello"}]
        stream = await client.post("/llm/v1/messages", json={**message, "stream": True})
        assert stream.status_code == 200 and "event: message_stop" in stream.text
        assert (await client.get("/healthz")).status_code == 200
    assert [call.surface for call in fake.calls] == ["openai", "openai", "anthropic", "anthropic"]
    assert seen == {"POST /v1/chat/completions": 2, "POST /llm/v1/messages": 2}
    assert container.gate().snapshot("up").in_use == 0


def test_the_edge_wraps_the_app_and_no_dialect_route_has_middleware_of_its_own() -> None:
    """`EdgeMiddleware` wraps the whole Litestar app, not each Router: Litestar gives a route
    with middleware a second exception-handling layer, one more coroutine on every message
    sent (per token of a stream). Every route is still Litestar's."""
    app = bootstrap.build_app(load_config_text(CONFIG))
    assert isinstance(app, EdgeMiddleware)
    handlers = [handler for route in app.app.routes for handler in getattr(route, "route_handlers", ())]
    paths = {path for handler in handlers for path in handler.paths}
    assert {"/v1/chat/completions", "/llm/v1/messages", "/v1/responses"} <= paths
    assert [handler for handler in handlers if handler.resolve_middleware()] == []
