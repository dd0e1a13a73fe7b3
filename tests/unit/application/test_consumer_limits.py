"""Consumer limits around a request (issue 15), with fakes of our own ports.

429 before admission (never a queue place), a consumer slot held for the whole request,
and the reservation settled with what was used: the upstream's usage, an estimate for an
upstream that reports none, what was produced for a cut request, nothing when the
request never reached the upstream.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.application.test_chat_service import CHUNKS, FakeGate, FakeUpstream

from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from application.consumer_limits import ConsumerLimits
from domain.canonical import ChatRequest, Finish, Message, StreamChunk, TextDelta, TextPart, UsageReport
from domain.consumers import ANONYMOUS, Consumer, LimitKind, RateSnapshot, RateState
from domain.consumers import ConsumerLimits as Limits
from domain.errors import QueueFull, RateLimited, UpstreamError, UpstreamUnavailable
from domain.records import RequestRecord
from domain.routing import ModelRouter

SNAPSHOT = RateSnapshot(requests=RateState(kind=LimitKind.REQUESTS_PER_MINUTE, limit=10, remaining=9,
                                           reset_seconds=6.0))
LIMITED = Consumer(name="batch", limits=Limits(requests_per_minute=10, max_in_flight=1))


class FakeReservation:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.snapshot = SNAPSHOT
        self.settled: list[int] = []

    async def settle(self, tokens_used: int) -> None:
        self.settled.append(tokens_used)


class FakeUsage:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.reservations: list[FakeReservation] = []

    async def reserve(self, consumer: Consumer, tokens: int) -> FakeReservation:
        if self.refuse:
            raise RateLimited(LimitKind.REQUESTS_PER_MINUTE, 6, SNAPSHOT)
        reservation = FakeReservation(tokens)
        self.reservations.append(reservation)
        return reservation

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class FakeSlot:
    def __init__(self, owner: FakeConcurrency) -> None:
        self.owner = owner

    async def release(self) -> None:
        self.owner.held -= 1


class FakeConcurrency:
    def __init__(self) -> None:
        self.held = 0
        self.waits: list[float] = []

    async def acquire(self, consumer: Consumer, timeout: float) -> FakeSlot:
        self.waits.append(timeout)
        self.held += 1
        return FakeSlot(self)


def chat(stream: bool = False, text: str = "x" * 40, max_tokens: int = 100) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text=text)])],
                       stream=stream, max_tokens=max_tokens)


def service(gate: FakeGate, upstream: FakeUpstream, usage: FakeUsage, slots: FakeConcurrency) -> ChatService:
    return ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, gate, queue_update_interval=0.01,
                       clock=SystemClock(), consumers=ConsumerLimits(usage, slots, {"up": 7.0}))


async def test_over_a_limit_is_a_429_before_admission() -> None:
    gate, upstream, slots = FakeGate(free=1), FakeUpstream(CHUNKS), FakeConcurrency()
    svc = service(gate, upstream, FakeUsage(refuse=True), slots)
    with pytest.raises(RateLimited) as refused:
        await svc.complete(chat(), consumer=LIMITED)
    assert refused.value.retry_after == 6 and refused.value.status == 429
    stream = svc.stream(chat(True), report_queue=True, consumer=LIMITED)
    with pytest.raises(RateLimited):
        await anext(stream)
    assert gate.free == 1 and gate.in_use == 0 and upstream.calls == [] and slots.waits == []


async def test_reservation_is_the_estimate_and_settles_with_the_reported_usage() -> None:
    usage, slots = FakeUsage(), FakeConcurrency()
    record = RequestRecord(request_id="r", surface="s", route="/", method="POST", status=0, duration_seconds=0)
    svc = service(FakeGate(free=2), FakeUpstream(CHUNKS), usage, slots)
    items = [item async for item in svc.stream(chat(True), record=record, consumer=LIMITED)]
    assert items == [[c] for c in CHUNKS]  # the upstream reported usage: nothing added
    (reservation,) = usage.reservations
    assert reservation.tokens == 10 + 4 + 100  # 40 chars / 4, one message, max_tokens
    assert reservation.settled == [3 + 1]  # CHUNKS report 3 + 1
    assert record.rate == SNAPSHOT
    assert slots.waits == [7.0] and slots.held == 0  # the upstream's queue timeout; released


async def test_an_upstream_without_usage_is_charged_and_reported_by_estimate() -> None:
    usage = FakeUsage()
    chunks = [StreamChunk(events=[TextDelta(text="a")]), StreamChunk(events=[TextDelta(text="b")]),
              StreamChunk(events=[Finish(reason="end_turn")])]
    svc = service(FakeGate(free=1), FakeUpstream(chunks), usage, FakeConcurrency())
    items = [item async for item in svc.stream(chat(True), consumer=LIMITED)]
    last = items[-1][0].events[0]
    assert isinstance(last, UsageReport)
    assert (last.usage.input_tokens, last.usage.output_tokens) == (14, 2)  # never 0
    assert usage.reservations[0].settled == [16]


async def test_anonymous_requests_get_the_estimate_too_without_any_ledger() -> None:
    svc = service(FakeGate(free=1), FakeUpstream([StreamChunk(events=[TextDelta(text="a")])]), FakeUsage(),
                  FakeConcurrency())
    items = [item async for item in svc.stream(chat(True), consumer=ANONYMOUS)]
    assert isinstance(items[-1][0].events[0], UsageReport)
    response = await service(FakeGate(free=1), FakeUpstream(), FakeUsage(), FakeConcurrency()).complete(chat())
    assert response.usage.input_tokens == 14  # the fake reports no usage: estimated, not 0


async def test_a_hang_up_mid_stream_charges_what_was_produced_and_frees_everything() -> None:
    usage, slots, gate = FakeUsage(), FakeConcurrency(), FakeGate(free=1)
    upstream = FakeUpstream([StreamChunk(events=[TextDelta(text="a")])], hang=True)
    stream = service(gate, upstream, usage, slots).stream(chat(True), consumer=LIMITED)
    assert (await anext(stream))[0].events[0] == TextDelta(text="a")
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    pending.cancel()  # the edge cancels the task when the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await pending
    await stream.aclose()
    assert usage.reservations[0].settled == [14 + 1]
    assert slots.held == 0 and gate.in_use == 0 and upstream.closed == 1


async def test_refused_by_the_gate_or_failed_upstream_settles_nothing_or_the_prompt() -> None:
    usage, slots = FakeUsage(), FakeConcurrency()
    with pytest.raises(QueueFull):
        await service(FakeGate(free=0, reject=True), FakeUpstream(), usage, slots).complete(chat(), consumer=LIMITED)
    assert usage.reservations[0].settled == [0]  # never reached the upstream: nothing charged
    with pytest.raises(UpstreamError):
        await service(FakeGate(free=1), FakeUpstream(fail=UpstreamError("boom")), usage, slots).complete(
            chat(), consumer=LIMITED)
    assert usage.reservations[1].settled == [14]  # the prompt was sent
    with pytest.raises(UpstreamUnavailable):
        await service(FakeGate(free=1), FakeUpstream(fail=UpstreamUnavailable("down")), usage, slots).complete(
            chat(), consumer=LIMITED)
    assert usage.reservations[2].settled == [0]  # never reached: nothing charged
    assert slots.held == 0
