"""A request's slot-seconds (`RequestRecord.slot_seconds`): from the slot granted to its release,
times the slots held, on every path (answered, streamed, failed, hung up), never the queue wait."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
from tests.unit.adapters.test_memory_gate import FakeClock
from tests.unit.application.test_chat_service import CHUNKS, FakeUpstream
from tests.unit.application.test_completion_services import ROUTER, FakeClient
from tests.unit.application.test_sequences_and_salt import Lease, SlotsGate, chat

from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from domain.canonical import ChatRequest, ChatResponse, StreamChunk
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import UpstreamError
from domain.records import RequestRecord
from domain.routing import ModelRouter


def _record() -> RequestRecord:
    return RequestRecord(request_id="r", surface="v1", route="/v1/chat/completions", method="POST", status=0,
                         duration_seconds=0)


class WaitingGate(SlotsGate):
    """Admits after `wait` seconds of the clock (a queue wait), at once otherwise."""

    def __init__(self, clock: FakeClock, wait: float = 0.0) -> None:
        super().__init__()
        self.clock, self.wait = clock, wait

    async def enter(self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
                    prefer: Sequence[str] = (), max_extra: int = 0) -> Lease:
        self.clock.advance(self.wait)
        return await super().enter(upstream, consumer, slots, prefer, max_extra)


class SlowUpstream(FakeUpstream):
    """Each answer takes 2 s of the clock; each streamed read 0.5 s."""

    def __init__(self, clock: FakeClock, fail: Exception | None = None) -> None:
        super().__init__(CHUNKS, fail)
        self.clock = clock

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.clock.advance(2.0)
        return await super().complete(request)

    @asynccontextmanager
    async def open_stream(
        self, request: ChatRequest, heartbeat: float | None = None
    ) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        async with super().open_stream(request, heartbeat) as batches:
            async def slow() -> AsyncIterator[list[StreamChunk]]:
                async for batch in batches:
                    self.clock.advance(0.5)
                    yield batch

            yield slow()


async def test_chat_answers_and_streams_count_the_time_held_times_the_slots() -> None:
    clock = FakeClock()
    gate = WaitingGate(clock, wait=5.0)  # queued 5 s each: not slot time
    service = ChatService(ModelRouter({"up": ["m"]}), {"up": SlowUpstream(clock)}, gate, 0.01, clock)
    answered, streamed = _record(), _record()
    await service.complete(chat(n=3), answered)
    async for _ in service.stream(chat(n=2), record=streamed):
        pass
    assert answered.slot_seconds == 3 * 2.0 and answered.queue_wait_seconds == 5.0
    assert streamed.slot_seconds == 2 * 3 * 0.5 and gate.in_use == 0


async def test_a_failed_call_and_a_hang_up_count_the_time_they_held() -> None:
    clock = FakeClock()
    failing = ChatService(ModelRouter({"up": ["m"]}), {"up": SlowUpstream(clock, UpstreamError("boom"))},
                          SlotsGate(), 0.01, clock)
    failed = _record()
    with pytest.raises(UpstreamError):
        await failing.complete(chat(), failed)
    assert failed.slot_seconds == 2.0
    service = ChatService(ModelRouter({"up": ["m"]}), {"up": SlowUpstream(clock)}, SlotsGate(), 0.01, clock)
    gone = _record()
    stream = service.stream(chat(), record=gone)
    await anext(stream)  # the client reads one batch, then hangs up
    await stream.aclose()  # type: ignore[attr-defined]
    assert gone.slot_seconds == 0.5


class SlowClient(FakeClient):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    async def complete_text(self, request: CompletionRequest) -> Completion:
        self.clock.advance(1.5)
        return await super().complete_text(request)

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        self.clock.advance(0.25)
        return await super().embed(request)


async def test_text_completions_and_embeddings_count_theirs() -> None:
    clock = FakeClock()
    client, gate = SlowClient(clock), SlotsGate()
    text, vectors = _record(), _record()
    await CompletionService(ROUTER, {"up": client}, gate, clock).complete(
        CompletionRequest(model="m", prompt=["a", "b"]), text)
    await EmbeddingService(ROUTER, {"up": client}, gate, clock).embed(
        EmbeddingRequest(model="m", inputs=["a", "b", "c"]), vectors)
    assert text.slot_seconds == 2 * 1.5 and vectors.slot_seconds == 3 * 0.25  # a slot per prompt, per input
