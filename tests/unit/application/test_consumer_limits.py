"""Consumer limits around a request, with fakes of our own ports.

At the door (before the body is read): the request count (429) and a consumer slot
(bounded waiters: 429), held until the door is released. Once decoded: the token
reservation (429 before admission, never a queue place), settled with what was used: the
upstream's usage, an estimate for an upstream that reports none, what was produced for a
cut request, nothing when the request never reached the upstream.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.application.test_chat_service import CHUNKS, FakeGate, FakeUpstream
from tests.unit.application.test_completion_services import ROUTER, FakeClient

from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.consumer_limits import ConsumerLimits
from domain.canonical import ChatRequest, Finish, Message, StreamChunk, TextDelta, TextPart, UsageReport
from domain.completions import CompletionRequest, EmbeddingRequest
from domain.consumers import ANONYMOUS, Consumer, LimitKind, RateSnapshot, RateState
from domain.consumers import ConsumerLimits as Limits
from domain.errors import QueueFull, RateLimited, UpstreamError, UpstreamUnavailable
from domain.records import RequestRecord
from domain.routing import ModelRouter

SNAPSHOT = RateSnapshot(requests=RateState(kind=LimitKind.REQUESTS_PER_MINUTE, limit=10, remaining=9,
                                           reset_seconds=6.0))
LIMITED = Consumer(name="batch", limits=Limits(requests_per_minute=10, tokens_per_minute=1000, max_in_flight=1))


class FakeReservation:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.snapshot = SNAPSHOT
        self.settled: list[int] = []

    async def settle(self, tokens_used: int) -> None:
        self.settled.append(tokens_used)


class FakeUsage:
    def __init__(self, refuse: LimitKind | None = None) -> None:
        self.refuse = refuse
        self.requests = 0
        self.reservations: list[FakeReservation] = []

    async def take_request(self, consumer: Consumer) -> RateSnapshot:
        if self.refuse is LimitKind.REQUESTS_PER_MINUTE:
            raise RateLimited(LimitKind.REQUESTS_PER_MINUTE, 6, SNAPSHOT)
        self.requests += 1
        return SNAPSHOT

    async def reserve_tokens(self, consumer: Consumer, tokens: int) -> FakeReservation:
        if self.refuse is LimitKind.TOKENS_PER_MINUTE:
            raise RateLimited(LimitKind.TOKENS_PER_MINUTE, 6, SNAPSHOT)
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
    def __init__(self, busy: bool = False) -> None:
        self.held = 0
        self.busy = busy  # max_waiting waiters already: refuse
        self.waits: list[tuple[float, int]] = []

    async def acquire(self, consumer: Consumer, timeout: float, max_waiting: int) -> FakeSlot:
        self.waits.append((timeout, max_waiting))
        if self.busy:
            raise RateLimited(LimitKind.MAX_IN_FLIGHT, 1)
        self.held += 1
        return FakeSlot(self)


def chat(stream: bool = False, text: str = "x" * 40, max_tokens: int = 100) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text=text)])],
                       stream=stream, max_tokens=max_tokens)


def service(gate: FakeGate, upstream: FakeUpstream, usage: FakeUsage, slots: FakeConcurrency) -> ChatService:
    return ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, gate, queue_update_interval=0.01,
                       clock=SystemClock(), consumers=ConsumerLimits(usage, slots, 7.0, 5))


def record() -> RequestRecord:
    return RequestRecord(request_id="r", surface="s", route="/", method="POST", status=0, duration_seconds=0)


async def test_over_the_request_limit_is_a_429_at_the_door_without_a_slot() -> None:
    slots = FakeConcurrency()
    svc = service(FakeGate(free=1), FakeUpstream(CHUNKS), FakeUsage(refuse=LimitKind.REQUESTS_PER_MINUTE), slots)
    seen = record()
    with pytest.raises(RateLimited) as refused:
        await svc.admit(LIMITED, seen)
    assert refused.value.retry_after == 6 and refused.value.status == 429
    assert slots.waits == [] and (seen.rate, seen.rate_limit) == (SNAPSHOT, "requests_per_minute")


async def test_the_door_takes_one_request_and_holds_a_consumer_slot_until_released() -> None:
    usage, slots = FakeUsage(), FakeConcurrency()
    svc = service(FakeGate(free=1), FakeUpstream(CHUNKS), usage, slots)
    seen = record()
    door = await svc.admit(LIMITED, seen)
    assert (usage.requests, slots.held, slots.waits) == (1, 1, [(7.0, 5)])  # the wait and max_waiting given
    assert seen.rate == SNAPSHOT
    await door.release()
    await door.release()  # idempotent
    assert slots.held == 0
    open_door = await svc.admit(ANONYMOUS)
    await open_door.release()
    assert (usage.requests, slots.waits) == (1, [(7.0, 5)])  # the anonymous consumer costs nothing


async def test_too_many_waiting_is_the_consumers_own_429_with_its_rate_state() -> None:
    svc = service(FakeGate(free=1), FakeUpstream(CHUNKS), FakeUsage(), FakeConcurrency(busy=True))
    seen = record()
    with pytest.raises(RateLimited) as refused:
        await svc.admit(LIMITED, seen)
    assert refused.value.limit is LimitKind.MAX_IN_FLIGHT and refused.value.snapshot == SNAPSHOT
    assert seen.rate_limit == "max_in_flight"


async def test_over_a_token_limit_is_a_429_before_admission() -> None:
    gate, upstream = FakeGate(free=1), FakeUpstream(CHUNKS)
    svc = service(gate, upstream, FakeUsage(refuse=LimitKind.TOKENS_PER_MINUTE), FakeConcurrency())
    with pytest.raises(RateLimited) as refused:
        await svc.complete(chat(), consumer=LIMITED)
    assert refused.value.retry_after == 6 and refused.value.status == 429
    stream = svc.stream(chat(True), report_queue=True, consumer=LIMITED)
    with pytest.raises(RateLimited):
        await anext(stream)
    assert gate.free == 1 and gate.in_use == 0 and upstream.calls == []


async def test_reservation_is_the_estimate_and_settles_with_the_reported_usage() -> None:
    usage = FakeUsage()
    seen = record()
    svc = service(FakeGate(free=2), FakeUpstream(CHUNKS), usage, FakeConcurrency())
    items = [item async for item in svc.stream(chat(True), record=seen, consumer=LIMITED)]
    assert items == [[c] for c in CHUNKS]  # the upstream reported usage: nothing added
    (reservation,) = usage.reservations
    assert reservation.tokens == 10 + 4 + 100  # 40 chars / 4, one message, max_tokens
    assert reservation.settled == [3 + 1]  # CHUNKS report 3 + 1
    assert seen.rate == SNAPSHOT


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
    assert gate.in_use == 0 and upstream.closed == 1


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


async def test_text_completions_and_embeddings_reserve_only_tokens_once_decoded() -> None:
    """The door (request count, consumer slot) is the edge's, before the body; the text-completion
    and embedding use cases, like chat, reserve the token estimate and settle it, nothing else."""
    usage, slots, gate = FakeUsage(), FakeConcurrency(), FakeGate(free=2)
    limits = ConsumerLimits(usage, slots, 7.0, 5)
    text = CompletionService(ROUTER, {"up": FakeClient()}, gate, SystemClock(), consumers=limits)
    embed = EmbeddingService(ROUTER, {"up": FakeClient()}, gate, SystemClock(), consumers=limits)
    seen = record()
    await text.complete(CompletionRequest(model="m", prompt=["a b c d"], max_tokens=4), seen, LIMITED)
    await embed.embed(EmbeddingRequest(model="m", inputs=["a b c"]), consumer=LIMITED)
    assert (usage.requests, slots.waits, gate.in_use) == (0, [], 0)  # no request count, no slot here
    assert [r.settled for r in usage.reservations] == [[3 + 2], [3]]  # the reported usage
    assert seen.rate == SNAPSHOT
    refusing = FakeUsage(refuse=LimitKind.TOKENS_PER_MINUTE)
    limits = ConsumerLimits(refusing, slots, 7.0, 5)
    for call in (CompletionService(ROUTER, {"up": FakeClient()}, gate, SystemClock(), consumers=limits).complete(
                     CompletionRequest(model="m", prompt=["x"]), consumer=LIMITED),
                 EmbeddingService(ROUTER, {"up": FakeClient()}, gate, SystemClock(), consumers=limits).embed(
                     EmbeddingRequest(model="m", inputs=["x"]), consumer=LIMITED)):
        with pytest.raises(RateLimited):
            await call
    assert gate.consumers == [LIMITED, LIMITED]  # the refused ones never entered the gate
