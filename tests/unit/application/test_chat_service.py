"""ChatService with fakes of its ports: every path gives the slot back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgspec
import pytest

from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    Finish,
    MessageStart,
    QueuePosition,
    StreamChunk,
    TextDelta,
    Usage,
    UsageReport,
)
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import AdmissionUnavailable, ModelNotFound, QueueFull, UpstreamError
from domain.records import RequestRecord
from domain.routing import ModelRouter
from ports.admission import GateSnapshot


class FakeLease:
    queued = False
    losable = False
    slots = 1  # one sequence

    def __init__(self, gate: FakeGate) -> None:
        self.lost = asyncio.Event()  # a one-process gate never loses a slot
        self.gate = gate
        self.released = False

    async def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate.in_use -= 1


class FakeTicket:
    queued = True

    def __init__(self, gate: FakeGate, positions: list[int]) -> None:
        self.gate = gate
        self.positions = positions
        self.cancelled = False
        self.granted = asyncio.Event()

    def position(self) -> int:
        return self.positions[0]

    async def wait(self, timeout: float) -> FakeLease | None:
        try:
            await asyncio.wait_for(self.granted.wait(), timeout)
        except TimeoutError:
            if len(self.positions) > 1:
                self.positions.pop(0)
            return None
        self.gate.in_use += 1
        return FakeLease(self.gate)

    async def cancel(self) -> None:
        self.cancelled = True


class FakeGate:
    """Admits `free` requests at once, then hands out scripted tickets or rejects."""

    def __init__(self, free: int = 1, tickets: list[FakeTicket] | None = None, reject: bool = False) -> None:
        self.free = free
        self.in_use = 0
        self.tickets = tickets or []
        self.reject = reject
        self.consumers: list[Consumer] = []  # who entered, in order

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> FakeLease | FakeTicket:
        self.consumers.append(consumer)
        if self.free > 0:
            self.free -= 1
            self.in_use += 1
            return FakeLease(self)
        if self.reject:
            raise QueueFull(retry_after=2)
        return self.tickets.pop(0)

    def snapshot(self, upstream: str) -> GateSnapshot:
        return GateSnapshot(in_use=self.in_use, queued=len(self.tickets), limit=1, queue_limit=4)

    def metered(self, upstream: str) -> bool:
        return False  # no upstream here orders by token service

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        raise AssertionError("never charged: not metered")

    def upstreams(self) -> list[str]:
        return ["up"]


class FakeUpstream:
    def __init__(self, chunks: list[StreamChunk] | None = None, fail: Exception | None = None,
                 hang: bool = False) -> None:
        self.chunks = chunks or []
        self.fail = fail
        self.hang = hang
        self.calls: list[ChatRequest] = []
        self.heartbeats: list[float | None] = []
        self.closed = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise self.fail
        return ChatResponse(id="x", model=request.model, created=0, content=[], finish_reason="end_turn")

    @asynccontextmanager
    async def open_stream(
        self, request: ChatRequest, heartbeat: float | None = None
    ) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        self.calls.append(request)
        self.heartbeats.append(heartbeat)
        if self.fail:
            raise self.fail

        async def chunks() -> AsyncIterator[list[StreamChunk]]:
            for chunk in self.chunks:
                yield [chunk]  # one upstream read each
            if self.hang:
                await asyncio.Event().wait()

        try:
            yield chunks()
        finally:
            self.closed += 1

    async def count_tokens(self, request: ChatRequest) -> int:
        return 3


CHUNKS = [
    StreamChunk(events=[MessageStart(id="a", model="m", created=0)]),
    StreamChunk(events=[TextDelta(text="hi")]),
    StreamChunk(events=[Finish(reason="end_turn"), UsageReport(usage=Usage(input_tokens=3, output_tokens=1))]),
]


def service(gate: FakeGate, upstream: FakeUpstream) -> ChatService:
    return ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, gate, queue_update_interval=0.01,
                       clock=SystemClock())


def request(stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=[], stream=stream)


async def test_complete_releases_on_success_and_on_error() -> None:
    gate = FakeGate(free=2)
    await service(gate, FakeUpstream()).complete(request())
    assert gate.in_use == 0
    with pytest.raises(UpstreamError):
        await service(gate, FakeUpstream(fail=UpstreamError("boom"))).complete(request())
    assert gate.in_use == 0


async def test_the_gate_sees_the_requests_consumer_on_both_paths() -> None:
    gate, frontend = FakeGate(free=3), Consumer(name="frontend", priority=10, weight=2)
    chat = service(gate, FakeUpstream(CHUNKS))
    await chat.complete(request(), consumer=frontend)
    _ = [item async for item in chat.stream(request(True), report_queue=True, consumer=frontend)]
    await chat.complete(request())
    assert gate.consumers == [frontend, frontend, ANONYMOUS]


async def test_complete_releases_when_cancelled() -> None:
    gate = FakeGate()
    task = asyncio.create_task(service(gate, FakeUpstream(hang=True)).complete(request()))
    await asyncio.sleep(0.01)
    assert gate.in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.in_use == 0


async def test_unknown_model_never_reaches_the_gate() -> None:
    gate = FakeGate(free=0)
    with pytest.raises(ModelNotFound):
        await service(gate, FakeUpstream()).complete(ChatRequest(model="nope", messages=[]))


async def test_stream_admitted_at_once_has_no_queue_positions() -> None:
    gate = FakeGate()
    items = [item async for item in service(gate, FakeUpstream(CHUNKS)).stream(request(True), report_queue=True)]
    assert items == [[c] for c in CHUNKS]  # one batch per upstream read
    assert gate.in_use == 0


async def test_stream_reports_positions_then_chunks() -> None:
    ticket = FakeTicket(FakeGate(), positions=[3, 2, 2, 1])
    gate = FakeGate(free=0, tickets=[ticket])
    ticket.gate = gate
    stream = service(gate, FakeUpstream(CHUNKS)).stream(request(True), report_queue=True)
    seen: list[object] = []
    async for item in stream:
        seen.append(item)
        if isinstance(item, QueuePosition) and item.position == 1:
            ticket.granted.set()
    positions = [i.position for i in seen if isinstance(i, QueuePosition)]
    assert positions == [3, 2, 1]  # unchanged positions are not repeated
    assert seen[len(positions):] == [[c] for c in CHUNKS]
    assert gate.in_use == 0


async def test_a_heartbeat_while_the_queue_position_stands_still_and_to_the_upstream() -> None:
    ticket = FakeTicket(FakeGate(), positions=[2, 1])  # 2, then 1 for the rest of the wait
    gate = FakeGate(free=0, tickets=[ticket])
    ticket.gate = gate
    upstream = FakeUpstream(CHUNKS)
    stream = service(gate, upstream).stream(request(True), report_queue=True, heartbeat=0.05)
    seen: list[object] = []
    async for item in stream:
        seen.append(item)
        if sum(1 for i in seen if i == []) == 2:
            ticket.granted.set()
    positions = [i.position for i in seen if isinstance(i, QueuePosition)]
    assert positions == [2, 1]
    assert seen[2:4] == [[], []]  # nothing new for 0.05 s in the queue: an empty batch each time
    assert seen[4:] == [[c] for c in CHUNKS]
    assert upstream.heartbeats == [0.05]  # the waits between the upstream's reads beat as well


async def test_stream_closed_while_queued_cancels_the_ticket() -> None:
    gate = FakeGate(free=0)
    ticket = FakeTicket(gate, positions=[1])
    gate.tickets = [ticket]
    upstream = FakeUpstream(CHUNKS)
    stream = service(gate, upstream).stream(request(True), report_queue=True)
    assert isinstance(await anext(stream), QueuePosition)
    await stream.aclose()
    assert ticket.cancelled and upstream.calls == [] and gate.in_use == 0


async def test_stream_cancelled_while_waiting_quietly_cancels_the_ticket() -> None:
    gate = FakeGate(free=0)
    ticket = FakeTicket(gate, positions=[1])
    gate.tickets = [ticket]
    upstream = FakeUpstream(CHUNKS)

    async def consume() -> None:
        async for _ in service(gate, upstream).stream(request(True)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ticket.cancelled and upstream.calls == []


async def test_stream_releases_and_closes_upstream_on_early_exit() -> None:
    gate = FakeGate()
    upstream = FakeUpstream(CHUNKS, hang=True)
    stream = service(gate, upstream).stream(request(True))
    await anext(stream)
    assert gate.in_use == 1
    await stream.aclose()
    assert gate.in_use == 0 and upstream.closed == 1


async def test_stream_refused_upstream_raises_before_any_item_and_releases() -> None:
    gate = FakeGate()
    stream = service(gate, FakeUpstream(fail=UpstreamError("refused"))).stream(request(True))
    with pytest.raises(UpstreamError):
        await anext(stream)
    assert gate.in_use == 0


async def test_queue_full_is_raised_before_any_item() -> None:
    gate = FakeGate(free=0, reject=True)
    with pytest.raises(QueueFull) as info:
        await anext(service(gate, FakeUpstream()).stream(request(True), report_queue=True))
    assert info.value.retry_after == 2


class FencedGate(FakeGate):
    """A shared-ledger gate whose leases carry a `lost` event (set when fenced)."""

    def __init__(self) -> None:
        super().__init__(free=1)
        self.lost = asyncio.Event()

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> FakeLease | FakeTicket:
        lease = await super().enter(upstream, consumer)
        lease.lost = self.lost  # type: ignore[union-attr]
        lease.losable = True  # type: ignore[union-attr]
        return lease


async def test_complete_is_aborted_when_the_lease_is_lost() -> None:
    gate = FencedGate()
    upstream = FakeUpstream(hang=True)
    task = asyncio.create_task(service(gate, upstream).complete(request()))
    await asyncio.sleep(0.01)
    gate.lost.set()
    with pytest.raises(AdmissionUnavailable):
        await task
    assert gate.in_use == 0


async def test_stream_stops_when_the_lease_is_lost() -> None:
    gate = FencedGate()
    stream = service(gate, FakeUpstream(CHUNKS)).stream(request(True))
    assert await anext(stream) == [CHUNKS[0]]
    gate.lost.set()
    with pytest.raises(AdmissionUnavailable):
        await anext(stream)
    assert gate.in_use == 0


async def test_an_alias_calls_the_upstream_with_its_own_model_name() -> None:
    upstream = FakeUpstream(chunks=CHUNKS)
    chat = ChatService(ModelRouter({"up": ["m", "m2"]}, {"up": ["claude-*"]}), {"up": upstream}, FakeGate(free=2),
                       queue_update_interval=0.01, clock=SystemClock())
    record = RequestRecord(request_id="r", surface="s", route="/r", method="POST", status=0, duration_seconds=0)
    asked = ChatRequest(model="claude-sonnet-4-6", messages=[])
    await chat.complete(asked, record)
    async for _ in chat.stream(msgspec.structs.replace(asked, stream=True)):
        pass
    assert await chat.count_tokens(asked) == 3
    assert [call.model for call in upstream.calls] == ["m", "m"]
    assert asked.model == "claude-sonnet-4-6"  # the dialect still has the client's name to answer with
    assert (record.model, record.upstream, record.upstream_model) == ("claude-sonnet-4-6", "up", "m")
    counted = RequestRecord(request_id="r", surface="s", route="/r", method="POST", status=0, duration_seconds=0)
    await chat.count_tokens(ChatRequest(model="m2", messages=[]), counted)
    assert (counted.model, counted.upstream_model) == ("m2", "m2")  # an exact name is its own label
