"""KV-cache affinity in the use cases (`application.affinity`), on the real in-process gate with
two replicas and the in-process store: a conversation's next turn goes back to its replica
(chat plain and streamed, text completions), consumers never share (their cache salts), and
an upstream without `[endpoints]` or with affinity off computes no chain at all."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

import application.affinity as affinity_module
from adapters.outbound.memory_affinity import MemoryAffinityStore
from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from application.affinity import Affinity, completion_chain
from application.chat import ChatService
from application.completions import CompletionService
from domain.admission.policy import AdmissionPolicy
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, Message, StreamChunk, TextDelta, TextPart, Usage
from domain.completions import Completion, CompletionRequest
from domain.consumers import ANONYMOUS, Consumer
from domain.routing import ModelRouter

A, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"
POLICY = AdmissionPolicy(max_in_flight=12, queue_depth=4, queue_timeout_seconds=5)
SYSTEM = Message(role="system", content=[TextPart(text="You are an agent with tools. " * 300)])


class Noting:
    """An upstream client answering at once, noting the replica of every call."""

    def __init__(self) -> None:
        self.replicas: list[str | None] = []

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        self.replicas.append(replica)
        return ChatResponse(id="c", model=request.model, created=0, content=[TextPart(text="ok")],
                            finish_reason="end_turn", usage=Usage(input_tokens=1, output_tokens=1))  # fmt: skip

    @asynccontextmanager
    async def open_stream(self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None
                          ) -> AsyncIterator[AsyncIterator[ChunkBatch]]:  # fmt: skip
        self.replicas.append(replica)

        async def batches() -> AsyncIterator[ChunkBatch]:
            yield [StreamChunk(events=[TextDelta(text="ok")])]

        yield batches()

    @asynccontextmanager
    async def open_text_stream(self, request: CompletionRequest, replica: str | None = None
                               ) -> AsyncIterator[AsyncIterator[ChunkBatch]]:  # fmt: skip
        async with self.open_stream(request, replica) as batches:  # type: ignore[arg-type]
            yield batches

    async def complete_text(self, request: CompletionRequest, replica: str | None = None) -> Completion:
        self.replicas.append(replica)
        return Completion(id="c", model=request.model, created=0, text="ok", finish_reason="end_turn",
                          usage=Usage(input_tokens=1, output_tokens=1))  # fmt: skip


class CountingStore(MemoryAffinityStore):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0
        self.records: list[str] = []

    async def lookup(self, upstream: str, chain: Sequence[int]) -> list[str]:
        self.lookups += 1
        return await super().lookup(upstream, chain)

    async def record(self, upstream: str, chain: Sequence[int], replica: str) -> None:
        self.records.append(replica)
        await super().record(upstream, chain, replica)


def setup(affinity_for: dict[str, int] | None = None) -> tuple[ChatService, CompletionService, Noting, CountingStore]:
    gate = InMemoryAdmissionGate({"up": POLICY, "plain": None}, SystemClock(), replica_limits={"up": 4})
    gate.set_replicas("up", [A, B, C])
    store = CountingStore()
    affinity = Affinity(store, {"up": 1} if affinity_for is None else affinity_for)
    router = ModelRouter({"up": ["m"], "plain": ["p"]})
    client = Noting()
    upstreams = {"up": client, "plain": client}
    chat = ChatService(router, upstreams, gate, 1.0, SystemClock(), affinity=affinity)  # type: ignore[arg-type]
    text = CompletionService(router, upstreams, gate, SystemClock(), affinity=affinity)  # type: ignore[arg-type]
    return chat, text, client, store


def conversation(tag: str, turns: int, model: str = "m", system: Message = SYSTEM) -> list[ChatRequest]:
    history = [system, Message(role="user", content=[TextPart(text=f"{tag}: fix the bug " * 5)])]
    out = [ChatRequest(model=model, messages=list(history))]
    for n in range(1, turns):
        history += [Message(role="assistant", content=[TextPart(text=f"step {n} " * 10)]),
                    Message(role="user", content=[TextPart(text=f"result {n}")])]  # fmt: skip
        out.append(ChatRequest(model=model, messages=list(history)))
    return out


async def test_each_conversation_stays_on_its_replica_plain_and_streamed() -> None:
    chat, _, client, store = setup()
    own = [Message(role="system", content=[TextPart(text=f"You are agent {c}. " * 100)]) for c in range(3)]
    talks = [conversation(f"conv-{c}", 4, system=own[c]) for c in range(3)]
    for turn in range(4):
        for c, talk in enumerate(talks):
            if (turn + c) % 2:
                await chat.complete(talk[turn])
            else:
                async for _ in chat.stream(talk[turn]):
                    pass
    homes = [client.replicas[c::3] for c in range(3)]
    assert all(len(set(calls)) == 1 for calls in homes), homes  # every turn on its first turn's replica
    assert {calls[0] for calls in homes} == {A, B, C}  # first turns: the least loaded (ties rotate)
    assert store.records == client.replicas


async def test_a_shared_system_prompt_draws_first_turns_to_its_replica_within_the_extra() -> None:
    chat, _, client, _ = setup()
    for c in range(3):
        await chat.complete(conversation(f"conv-{c}", 1)[0])
    assert client.replicas == [A, A, A]  # one at a time: A is never above the least loaded
    slots = chat._slots
    held = [(await slots.admit_quietly("up", None, ANONYMOUS))[0] for _ in range(2)]  # B and C: 1 each
    held += [(await slots.admit_quietly("up", None, ANONYMOUS, prefer=[A], max_extra=1))[0] for _ in range(2)]
    assert [lease.replica for lease in held] == [B, C, A, A]
    await chat.complete(conversation("conv-9", 1)[0])  # A holds 2, the least 1: within the extra
    held.append((await slots.admit_quietly("up", None, ANONYMOUS, prefer=[A], max_extra=1))[0])
    await chat.complete(conversation("conv-10", 1)[0])  # A holds 3, the least 1: the least loaded
    assert client.replicas[3:] == [A, B]
    for lease in held:
        await lease.release()


async def test_without_affinity_turns_rotate_over_the_replicas() -> None:
    chat, _, client, store = setup(affinity_for={})
    for request in conversation("conv-1", 3):
        await chat.complete(request)
    assert client.replicas == [A, B, C] and store.lookups == 0 and store.records == []


async def test_an_upstream_without_endpoints_computes_no_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> list[int]:
        raise AssertionError("no chain for this upstream")

    monkeypatch.setattr(affinity_module, "affinity_chain", boom)
    chat, _, client, store = setup()
    for request in conversation("conv-1", 2, model="p"):
        await chat.complete(request)
    assert client.replicas == [None, None] and store.lookups == 0


async def test_consumers_never_share_a_prefix_or_a_key() -> None:
    chat, _, client, store = setup()
    alice, bob = Consumer(name="alice", cache_salt="a" * 43), Consumer(name="bob", cache_salt="b" * 43)
    first, second = conversation("same", 2)
    await chat.complete(first, consumer=alice)
    assert await store.lookup("up", chain_of(second, alice)) == [A]
    assert await store.lookup("up", chain_of(second, bob)) == []  # bob's salt: nothing of alice's
    await chat.complete(ChatRequest(model="m", messages=first.messages, affinity_key="k"), consumer=alice)
    keyed = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])], affinity_key="k")
    assert await store.lookup("up", chain_of(keyed, alice)) == [B]
    assert await store.lookup("up", chain_of(keyed, bob)) == []
    assert await store.lookup("up", chain_of(keyed, ANONYMOUS)) == []
    assert client.replicas == [A, B]


def chain_of(request: ChatRequest, consumer: Consumer) -> list[int]:
    return affinity_module.affinity_chain(request, consumer.cache_salt)


async def test_a_growing_text_prompt_or_its_user_keeps_its_replica() -> None:
    _, text, client, store = setup()
    prompt = "def solve(x):\n    " * 40
    for n in range(3):
        await text.complete(CompletionRequest(model="m", prompt=[prompt]))
        prompt += f"# step {n}\n" * 30
    async for _ in text.stream(CompletionRequest(model="m", prompt=[prompt])):
        pass
    assert client.replicas == [A] * 4
    await text.complete(CompletionRequest(model="m", prompt=["x"], user="u-1"))
    await text.complete(CompletionRequest(model="m", prompt=["short, other"], user="u-1"))
    assert client.replicas[4:] == [B, B]
    assert completion_chain(CompletionRequest(model="m", prompt=["x"])) == []  # shorter than a block: no chain
    assert completion_chain(CompletionRequest(model="m", prompt=["x"], user="u"), "s1") != completion_chain(
        CompletionRequest(model="m", prompt=["x"], user="u"), "s2")
    assert store.records == client.replicas
