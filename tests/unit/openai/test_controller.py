"""The `/v1` Router on Litestar, driven over ASGI, with fakes of the chat service's ports (no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from litestar import Litestar
from tests.support import asgi

from adapters.inbound._shared.dialect import EdgeContext
from adapters.inbound._shared.edge import EdgeMiddleware
from adapters.inbound.openai import router
from application.chat import ChatService
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    Finish,
    MessageStart,
    NativePayload,
    StreamChunk,
    StreamError,
    TextDelta,
    Usage,
    UsageReport,
)
from domain.consumers import Consumer
from domain.errors import QueueFull, UpstreamError
from domain.records import RequestRecord
from domain.routing import ModelRouter
from ports.admission import GateSnapshot

dec = msgspec.json.decode


def native(data: bytes, *events: Any) -> StreamChunk:
    return StreamChunk(events=list(events), native=NativePayload(format="openai-chat", data=data))


NATIVE = [
    native(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
           MessageStart(id="chatcmpl-9", model="m", created=1)),
    native(b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}', TextDelta(text="hi")),
    native(b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', Finish(reason="end_turn")),
    native(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
           UsageReport(usage=Usage(input_tokens=3, output_tokens=2))),
]  # fmt: skip


def frames(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n\n")
    return [f.removeprefix(b"data: ") for f in data.split(b"\n\n")[:-1]]


class FakeLease:
    queued = False
    losable = False
    slots = 1  # one sequence

    def __init__(self, gate: FakeGate) -> None:
        self.lost = asyncio.Event()  # a one-process gate never loses a slot
        self.gate, self.released = gate, False

    async def release(self) -> None:
        if not self.released:
            self.released, self.gate.in_use = True, self.gate.in_use - 1


class FakeGate:
    def __init__(self, reject: bool = False) -> None:
        self.reject, self.in_use = reject, 0

    async def enter(
        self, upstream: str, consumer: object = None, slots: int = 1, prefer: Sequence[str] = (), max_extra: int = 0
    ) -> FakeLease:
        if self.reject:
            raise QueueFull(retry_after=2)
        self.in_use += 1
        return FakeLease(self)

    def snapshot(self, upstream: str) -> GateSnapshot:
        return GateSnapshot(in_use=self.in_use, queued=0, limit=None, queue_limit=None)

    def metered(self, upstream: str) -> bool:
        return False  # no upstream here orders by token service

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        raise AssertionError("never charged: not metered")

    def upstreams(self) -> list[str]:
        return ["up"]


class FakeUpstream:
    def __init__(self, chunks: list[StreamChunk | list[StreamChunk]] | None = None,
                 fail_after: Exception | None = None,
                 hang: bool = False, response: ChatResponse | None = None) -> None:  # fmt: skip
        self.chunks, self.fail_after, self.hang, self.response = chunks or [], fail_after, hang, response
        self.calls: list[ChatRequest] = []
        self.closed = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls.append(request)
        assert self.response is not None
        return self.response

    @asynccontextmanager
    async def open_stream(
        self, request: ChatRequest, heartbeat: float | None = None
    ) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        self.calls.append(request)

        async def chunks() -> AsyncIterator[list[StreamChunk]]:
            for item in self.chunks:  # a chunk is a read of its own; a list, one read of several
                yield item if isinstance(item, list) else [item]
            if self.fail_after is not None:
                raise self.fail_after
            if self.hang:
                await asyncio.Event().wait()

        try:
            yield chunks()
        finally:
            self.closed += 1

    async def count_tokens(self, request: ChatRequest) -> int:
        return 0


class FakeClock:
    def now(self) -> float:
        return 0.0


class FakeObserver(list[RequestRecord]):
    def request_started(self, record: RequestRecord, headers: object) -> object:
        return None

    def request_finished(self, record: RequestRecord, handle: object = None) -> None:
        self.append(record)


class Edge:
    """The `/v1` Router over one fake upstream, on a Litestar app driven over ASGI."""

    def __init__(self, upstream: FakeUpstream, gate: FakeGate | None = None) -> None:
        self.upstream = upstream
        self.gate = gate or FakeGate()
        self.observer = FakeObserver()
        service = ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, self.gate, 0.01, FakeClock())
        context = EdgeContext(
            service=service, observer=self.observer, max_body_bytes=1000, ping_interval_seconds=10.0
        )
        self.app = EdgeMiddleware(Litestar(route_handlers=[router(context)], openapi_config=None, logging_config=None))
        self.exchange = asgi.Exchange()
        self.hang_up_after_frames: int | None = None  # the client leaves after this many

    async def call(self, path: str, body: dict[str, Any] | None = None, method: str = "POST") -> None:
        data = msgspec.json.encode(body) if body is not None else b""
        ex = self.exchange
        if self.hang_up_after_frames is not None:
            limit = self.hang_up_after_frames

            class Leaving(list[dict[str, Any]]):
                def append(self, message: dict[str, Any]) -> None:
                    super().append(message)
                    if sum(1 for m in self if m.get("more_body")) == limit:
                        ex.hang_up.set()

            ex.messages = Leaving()
        await asgi.request(self.app, method, path, data, exchange=ex)

    @property
    def sent(self) -> list[dict[str, Any]]:
        return self.exchange.messages

    @property
    def status(self) -> int:
        return self.exchange.status

    @property
    def headers(self) -> dict[bytes, bytes]:
        return self.exchange.headers

    @property
    def body(self) -> bytes:
        return self.exchange.body


REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_stream_starts_at_the_first_chunk_and_ends_with_done() -> None:
    edge = Edge(FakeUpstream(NATIVE))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    assert edge.status == 200 and edge.headers[b"content-type"].startswith(b"text/event-stream")
    assert frames(edge.body) == [c.native.data for c in NATIVE[:3] if c.native] + [b"[DONE]"]
    assert edge.upstream.closed == 1 and edge.gate.in_use == 0
    record = edge.observer[0]
    assert (record.model, record.upstream, record.stream, record.status) == ("m", "up", True, 200)
    assert (record.input_tokens, record.output_tokens, record.finish_reason) == (3, 2, "end_turn")
    assert record.first_token_seconds is not None
    request = edge.upstream.calls[0]
    assert request.surface == "openai" and request.request_id == record.request_id


async def test_refusal_before_the_first_chunk_is_a_status_code() -> None:
    edge = Edge(FakeUpstream(NATIVE), FakeGate(reject=True))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    assert edge.status == 503 and edge.headers[b"retry-after"] == b"2"
    assert edge.headers[b"content-type"] == b"application/problem+json"
    assert dec(edge.body)["error"]["code"] == "queue-full"


async def test_unknown_model_is_404_and_never_reaches_the_upstream() -> None:
    edge = Edge(FakeUpstream(NATIVE))
    await edge.call("/v1/chat/completions", {**REQUEST, "model": "nope", "stream": True})
    assert edge.status == 404 and dec(edge.body)["error"]["code"] == "model-not-found"
    assert edge.upstream.calls == [] and edge.observer[0].model is None


async def test_in_stream_error_event_is_an_error_frame_and_done() -> None:
    error = StreamChunk(events=[StreamError(kind="upstream-error", message="boom", status=502)])
    edge = Edge(FakeUpstream([NATIVE[0], error, NATIVE[1]]))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    out = frames(edge.body)
    assert edge.status == 200 and dec(out[1])["error"]["message"] == "boom" and out[2:] == [b"[DONE]"]
    assert edge.upstream.closed == 1 and edge.gate.in_use == 0
    assert edge.observer[0].error_kind == "upstream-error"


async def test_upstream_failure_after_start_ends_the_stream_with_an_error_frame() -> None:
    edge = Edge(FakeUpstream(NATIVE[:2], fail_after=UpstreamError("connection reset")))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    out = frames(edge.body)
    assert dec(out[-2])["error"]["code"] == "upstream-error" and out[-1] == b"[DONE]"
    assert edge.gate.in_use == 0 and edge.upstream.closed == 1


async def test_chunks_of_one_upstream_read_go_out_in_one_send() -> None:
    edge = Edge(FakeUpstream([[NATIVE[0], NATIVE[1], NATIVE[2]], [NATIVE[3]]]))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    bodies = edge.exchange.chunks
    assert [frames(b) for b in bodies] == [
        [c.native.data for c in NATIVE[:3] if c.native], [b"[DONE]"]
    ]  # the held usage-only chunk produced nothing; [DONE] ends the stream
    assert edge.sent[-1].get("more_body") is not True


async def test_a_reads_frames_go_out_before_a_failure_that_follows_it() -> None:
    edge = Edge(FakeUpstream([[NATIVE[0], NATIVE[1]]], fail_after=UpstreamError("connection reset")))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    out = frames(edge.body)
    assert out[:2] == [c.native.data for c in NATIVE[:2] if c.native]
    assert dec(out[2])["error"]["code"] == "upstream-error" and out[3:] == [b"[DONE]"]


async def test_hang_up_mid_stream_closes_the_upstream_and_frees_the_slot() -> None:
    edge = Edge(FakeUpstream(NATIVE[:2], hang=True))
    edge.hang_up_after_frames = 2
    await asyncio.wait_for(edge.call("/v1/chat/completions", {**REQUEST, "stream": True}), 2)
    assert edge.upstream.closed == 1 and edge.gate.in_use == 0
    assert edge.observer[0].client_gone is True


async def test_hang_up_during_a_send_closes_the_stream_before_the_request_is_reported() -> None:
    """Litestar stops iterating a stream whose client left during a send, without closing
    it: the edge closes it, so the slot is free and the upstream closed by the time the
    request's record is reported (not when the generator is garbage-collected)."""
    edge = Edge(FakeUpstream(NATIVE[:2], hang=True))
    seen: list[tuple[int, int]] = []
    report = edge.observer.request_finished

    def finished(record: RequestRecord, handle: object = None) -> None:
        seen.append((edge.upstream.closed, edge.gate.in_use))
        report(record, handle)

    edge.observer.request_finished = finished  # type: ignore[method-assign]
    edge.exchange.stall_after = 1  # the first frame's send never completes
    await asyncio.wait_for(edge.call("/v1/chat/completions", {**REQUEST, "stream": True}), 2)
    assert seen == [(1, 0)] and edge.observer[0].client_gone is True


async def test_non_stream_relays_the_native_body() -> None:
    data = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[],"n_extra":1}'
    response = ChatResponse(
        id="chatcmpl-1",
        model="m",
        created=1,
        content=[],
        finish_reason="end_turn",
        usage=Usage(input_tokens=2, output_tokens=5),
        native=NativePayload(format="openai-chat", data=data),
    )
    edge = Edge(FakeUpstream(response=response))
    await edge.call("/v1/chat/completions", {**REQUEST, "seed": 3})
    assert edge.status == 200 and edge.body == data
    assert edge.headers[b"content-type"] == b"application/json"
    assert edge.upstream.calls[0].sampling.seed == 3
    assert edge.observer[0].output_tokens == 5


async def test_body_too_large_is_413() -> None:
    edge = Edge(FakeUpstream())
    await edge.call("/v1/chat/completions", {**REQUEST, "pad": "x" * 2000})
    assert edge.status == 413 and dec(edge.body)["status"] == 413


async def test_model_list() -> None:
    edge = Edge(FakeUpstream())
    await edge.call("/v1/models", method="GET")
    assert edge.status == 200 and [m["id"] for m in dec(edge.body)["data"]] == ["m"]


async def test_upstream_error_in_the_first_chunk_is_a_status_code() -> None:
    """Nothing was sent yet (e.g. the event stream's first frame is malformed): 502, not a 200."""
    error = StreamChunk(events=[StreamError(kind="upstream-protocol-error", message="bad frame", status=502)])
    edge = Edge(FakeUpstream([error, NATIVE[1]]))
    await edge.call("/v1/chat/completions", {**REQUEST, "stream": True})
    assert edge.status == 502 and edge.headers[b"content-type"] == b"application/problem+json"
    assert dec(edge.body)["error"]["code"] == "upstream-protocol-error"
    assert edge.upstream.closed == 1 and edge.gate.in_use == 0
    assert edge.observer[0].error_kind == "upstream-protocol-error"
