"""Sequences and the prefix-cache salt in the use cases, with fakes of our own ports.

A request for k sequences (`domain.sequences`) enters its upstream's gate as k slots and
reserves k times its output tokens; every request of a known consumer reaches the upstream
with that consumer's `cache_salt`, whatever the client sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.unit.application.test_chat_service import CHUNKS, FakeUpstream
from tests.unit.application.test_completion_services import ROUTER, FakeClient
from tests.unit.application.test_consumer_limits import FakeUsage

from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.consumer_limits import ConsumerLimits
from domain.canonical import ChatRequest, Message, TextPart
from domain.completions import CompletionRequest, EmbeddingRequest
from domain.consumers import ANONYMOUS, Consumer
from domain.consumers import ConsumerLimits as Limits
from domain.routing import ModelRouter
from domain.sequences import sequences
from domain.usage_estimate import prompt_tokens, reservation_tokens
from ports.admission import GateSnapshot

SALTED = Consumer(name="alice", cache_salt="s" * 43, limits=Limits(tokens_per_minute=10_000))


class Lease:
    queued = False
    losable = False

    def __init__(self, gate: SlotsGate, slots: int) -> None:
        self.gate, self.slots, self.lost = gate, slots, asyncio.Event()

    async def release(self) -> None:
        self.gate.in_use -= self.slots
        self.slots = 0


class SlotsGate:
    """Admits every request at once, recording the slots each took."""

    def __init__(self) -> None:
        self.entered: list[int] = []
        self.in_use = 0

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> Lease:
        self.entered.append(slots)
        self.in_use += slots
        return Lease(self, slots)

    def snapshot(self, upstream: str) -> GateSnapshot:
        return GateSnapshot(in_use=self.in_use, queued=0, limit=8, queue_limit=8)

    def metered(self, upstream: str) -> bool:
        return False  # no upstream here orders by token service

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        raise AssertionError("never charged: not metered")

    def upstreams(self) -> list[str]:
        return ["up"]


def chat(**fields: object) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="x" * 40)])], **fields)


def test_the_sequences_of_a_request() -> None:
    assert sequences(chat()) == 1 and sequences(chat(n=3)) == 3 and sequences(chat(n=2, best_of=5)) == 5
    assert sequences(CompletionRequest(model="m", prompt=["a", "b"], n=2, best_of=3)) == 6
    assert sequences(EmbeddingRequest(model="m", inputs=["a", "b", "c"])) == 3


def test_k_sequences_reserve_k_times_the_output_tokens() -> None:
    one, four = chat(max_tokens=100), chat(max_tokens=100, n=4)
    assert reservation_tokens(one) == prompt_tokens(one) + 100
    assert reservation_tokens(four) == prompt_tokens(four) + 400
    text = CompletionRequest(model="m", prompt=["a", "b"], max_tokens=10, best_of=3)
    assert reservation_tokens(text) == prompt_tokens(text) + 60


async def test_chat_takes_k_slots_gives_them_back_and_carries_the_consumers_salt() -> None:
    gate, upstream, usage = SlotsGate(), FakeUpstream(CHUNKS), FakeUsage()
    service = ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, gate, 0.01, SystemClock(),
                          consumers=ConsumerLimits(usage))
    await service.complete(chat(n=3, max_tokens=10, cache_salt="chosen-by-a-client"), consumer=SALTED)
    async for _ in service.stream(chat(n=2, best_of=4), consumer=SALTED):
        pass
    await service.complete(chat())  # anonymous: one slot, no salt
    assert gate.entered == [3, 4, 1] and gate.in_use == 0
    assert [call.cache_salt for call in upstream.calls] == ["s" * 43, "s" * 43, None]
    assert usage.reservations[0].tokens == prompt_tokens(chat()) + 30


async def test_text_completions_and_embeddings_take_their_sequences_and_the_salt() -> None:
    gate, client = SlotsGate(), FakeClient()
    completions = CompletionService(ROUTER, {"up": client}, gate, SystemClock())
    embeddings = EmbeddingService(ROUTER, {"up": client}, gate, SystemClock())
    await completions.complete(CompletionRequest(model="m", prompt=["a", "b"], n=2), consumer=SALTED)
    async for _ in completions.stream(CompletionRequest(model="m", prompt=["a"], best_of=3, stream=True)):
        pass
    await embeddings.embed(EmbeddingRequest(model="m", inputs=["a", "b", "c", "d"]), consumer=SALTED)
    assert gate.entered == [4, 3, 4] and gate.in_use == 0
    assert [getattr(call, "cache_salt", None) for call in client.calls] == ["s" * 43, None, "s" * 43]
