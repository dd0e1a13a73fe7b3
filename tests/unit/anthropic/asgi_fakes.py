"""A scripted fake of the chat service, and the `/llm` Router on Litestar driven over ASGI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import msgspec
from litestar import Litestar
from tests.support import asgi

from adapters.inbound._shared.dialect import EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound.anthropic import router
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    Finish,
    MessageStart,
    StreamChunk,
    TextDelta,
    TextPart,
    Usage,
    UsageReport,
)
from domain.errors import ModelNotFound
from domain.records import RequestRecord

PING_INTERVAL = 0.05
BODY = {"model": "reasoning", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def chunk(*events: Any) -> StreamChunk:
    return StreamChunk(events=list(events))


ANSWER = [
    chunk(MessageStart(id="chatcmpl-1", model="reasoning", created=0)),
    chunk(TextDelta(text="alpha")),
    chunk(Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=2, output_tokens=1))),
]


class FakeService:
    """Plays a script: items are yielded, floats are sleeps, exceptions are raised."""

    def __init__(self, script: list[Any] | None = None) -> None:
        self.script = script or []
        self.requests: list[ChatRequest] = []
        self.consumers: list[object] = []  # what the edge passed: the anonymous consumer with auth off
        self.closed = asyncio.Event()
        self.count: int | Exception = 5

    def models(self) -> list[str]:
        return ["reasoning", "qwen"]

    def upstream_for(self, model: str) -> str:
        if model not in self.models():
            raise ModelNotFound(model)
        return "up"

    async def complete(self, request: ChatRequest, record: object = None, consumer: object = None) -> ChatResponse:
        self.requests.append(request)
        self.consumers.append(consumer)
        return ChatResponse(
            id="chatcmpl-9",
            model="x",
            created=0,
            content=[TextPart(text="hello")],
            finish_reason="end_turn",
            usage=Usage(input_tokens=3, output_tokens=1),
        )

    async def stream(
        self, request: ChatRequest, *, report_queue: bool = False, record: object = None, consumer: object = None,
        heartbeat: float | None = None,
    ) -> AsyncIterator[Any]:
        """As `ChatService.stream`: with `heartbeat`, a sleep yields an empty batch each time
        it has lasted that long."""
        assert report_queue
        self.requests.append(request)
        self.consumers.append(consumer)
        try:
            for item in self.script:
                if isinstance(item, float):
                    while heartbeat is not None and item >= heartbeat:
                        await asyncio.sleep(heartbeat)
                        item -= heartbeat
                        yield []
                    await asyncio.sleep(item)
                elif isinstance(item, Exception):
                    raise item
                elif isinstance(item, StreamChunk):
                    yield [item]  # a read of its own; a list is one read of several chunks
                else:
                    yield item
        finally:
            self.closed.set()

    async def count_tokens(self, request: ChatRequest, record: RequestRecord | None = None) -> int:
        if isinstance(self.count, Exception):
            raise self.count
        return self.count


class Observer:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def request_started(self, record: RequestRecord, headers: object) -> object:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        self.records.append(record)


Result = asgi.Exchange


async def call(
    service: FakeService,
    path: str,
    body: Any = None,
    method: str = "POST",
    hang_up_after: float | None = None,
    max_body: int = 10_000,
) -> tuple[Result, Observer]:
    """One request through the `/llm` Router on a Litestar app, driven over ASGI."""
    observer = Observer()
    context = EdgeContext(
        service=cast(Any, service),
        observer=observer,
        max_body_bytes=max_body,
        ping_interval_seconds=PING_INTERVAL,
    )
    app = EdgeMiddleware(Litestar(route_handlers=[router(context)], openapi_config=None, logging_config=None))
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body) if body is not None else b""
    exchange = asgi.Exchange()
    if hang_up_after is not None:
        asyncio.get_running_loop().call_later(hang_up_after, exchange.hang_up.set)
    headers = [(b"x-request-id", b"req-42")]
    await asyncio.wait_for(asgi.request(app, method, path, raw, headers, exchange), 5)
    return exchange, observer


def frames(result: Result) -> list[bytes]:
    """The body split into frames, comments included."""
    return [f + b"\n\n" for f in result.body.split(b"\n\n") if f]
