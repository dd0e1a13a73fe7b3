"""CompletionService and EmbeddingService with fakes of their ports: the same gate as chat,
the slot back on every path, usage reported or estimated, a queued hang-up leaving the queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from tests.unit.application.test_chat_service import CHUNKS, FakeGate, FakeTicket

from adapters.outbound.system_clock import SystemClock
from application.completions import CompletionService, EmbeddingService
from domain.canonical import StreamChunk, TextDelta, Usage, UsageReport
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.errors import ModelNotFound, QueueFull, UpstreamError
from domain.records import RequestRecord
from domain.routing import ModelRouter

ROUTER = ModelRouter({"up": ["m"]}, {"up": ["m-*"]})


class FakeClient:
    def __init__(self, fail: Exception | None = None, hang: bool = False, usage: Usage | None = None) -> None:
        self.fail, self.hang, self.usage = fail, hang, usage if usage is not None else Usage(input_tokens=3,
                                                                                             output_tokens=2)
        self.calls: list[object] = []
        self.closed = 0

    async def _answer(self, request: object) -> None:
        self.calls.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise self.fail

    async def complete_text(self, request: CompletionRequest) -> Completion:
        await self._answer(request)
        return Completion(id="c", model=request.model, created=0, text="alpha bravo", finish_reason="end_turn",
                          usage=self.usage)

    @asynccontextmanager
    async def open_text_stream(self, request: CompletionRequest) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        self.calls.append(request)
        if self.fail:
            raise self.fail

        async def batches() -> AsyncIterator[list[StreamChunk]]:
            for chunk in CHUNKS:
                yield [chunk]
            if self.hang:
                await asyncio.Event().wait()

        try:
            yield batches()
        finally:
            self.closed += 1

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        await self._answer(request)
        return Embeddings(model=request.model, vectors=[[1.0]] * len(request.inputs),
                          usage=Usage(input_tokens=self.usage.input_tokens))


def text(model: str = "m", stream: bool = False) -> CompletionRequest:
    return CompletionRequest(model=model, prompt=["a b c d"], max_tokens=4, stream=stream)


def completions(gate: FakeGate, client: FakeClient) -> CompletionService:
    return CompletionService(ROUTER, {"up": client}, gate, SystemClock())


def embeddings(gate: FakeGate, client: FakeClient) -> EmbeddingService:
    return EmbeddingService(ROUTER, {"up": client}, gate, SystemClock())


async def test_complete_routes_an_alias_and_gives_the_slot_back() -> None:
    gate, client, record = FakeGate(free=2), FakeClient(), RequestRecord(
        request_id="r", surface="openai", route="/v1/completions", method="POST", status=0, duration_seconds=0)
    answer = await completions(gate, client).complete(text("m-7b"), record)
    assert answer.text == "alpha bravo" and client.calls[0].model == "m"  # type: ignore[attr-defined]
    assert (record.upstream, record.model, gate.in_use) == ("up", "m-7b", 0)
    assert record.queue_wait_seconds is not None
    with pytest.raises(UpstreamError):
        await completions(gate, FakeClient(fail=UpstreamError("boom"))).complete(text())
    assert gate.in_use == 0


async def test_an_upstream_without_usage_is_charged_by_estimate() -> None:
    answer = await completions(FakeGate(), FakeClient(usage=Usage())).complete(text())
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
    vectors = await embeddings(FakeGate(), FakeClient(usage=Usage())).embed(EmbeddingRequest(model="m",
                                                                                           inputs=["a b c"]))
    assert vectors.usage.input_tokens > 0


@pytest.mark.parametrize("call", ["complete", "embed"])
async def test_cancelled_while_upstream_works_gives_the_slot_back(call: str) -> None:
    gate, client = FakeGate(), FakeClient(hang=True)
    work = (completions(gate, client).complete(text()) if call == "complete"
            else embeddings(gate, client).embed(EmbeddingRequest(model="m", inputs=["x"])))
    task = asyncio.create_task(work)
    await asyncio.sleep(0.01)
    assert gate.in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.in_use == 0


async def test_a_queued_hang_up_leaves_the_queue() -> None:
    ticket = FakeTicket(FakeGate(), positions=[1])
    gate = FakeGate(free=0, tickets=[ticket])
    ticket.gate = gate
    task = asyncio.create_task(embeddings(gate, FakeClient()).embed(EmbeddingRequest(model="m", inputs=["x"])))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ticket.cancelled and gate.in_use == 0


async def test_stream_batches_then_the_slot_back_and_an_early_close() -> None:
    gate, client = FakeGate(free=2), FakeClient()
    batches = [batch async for batch in completions(gate, client).stream(text(stream=True))]
    assert batches == [[c] for c in CHUNKS] and gate.in_use == 0 and client.closed == 1
    hanging = FakeClient(hang=True)
    stream = completions(gate, hanging).stream(text(stream=True))
    assert (await anext(stream))[0].events == CHUNKS[0].events
    await stream.aclose()  # the client went away mid-stream
    assert gate.in_use == 0 and hanging.closed == 1


async def test_a_stream_without_usage_ends_with_an_estimate() -> None:
    client = FakeClient()
    chunks = [StreamChunk(events=[TextDelta(text="x")])] * 3

    @asynccontextmanager
    async def no_usage(request: CompletionRequest) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        async def batches() -> AsyncIterator[list[StreamChunk]]:
            for chunk in chunks:
                yield [chunk]

        yield batches()

    client.open_text_stream = no_usage  # type: ignore[method-assign]
    batches = [batch async for batch in completions(FakeGate(), client).stream(text(stream=True))]
    last = batches[-1][0].events[0]
    assert isinstance(last, UsageReport) and last.usage.output_tokens == 3 and last.usage.input_tokens > 0


async def test_refusals_before_the_upstream() -> None:
    with pytest.raises(ModelNotFound):
        await completions(FakeGate(), FakeClient()).complete(text("nope"))
    with pytest.raises(QueueFull):
        await embeddings(FakeGate(free=0, reject=True), FakeClient()).embed(EmbeddingRequest(model="m", inputs=["x"]))
