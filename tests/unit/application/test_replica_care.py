"""Replica health in the request path (`application.replica_care`): outcomes reach the outlier
detection, ejections reach the gate (and end on time), and the one safe retry moves the lease.

The in-process gate with two or three replicas; a scripted upstream client fails on the
replicas the test names, with the `FailureKind` the outbound client would attach."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from application.completions import CompletionService, EmbeddingService
from application.replica_care import ReplicaCare
from domain.admission.policy import AdmissionPolicy
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, StreamChunk, TextDelta, TextPart, Usage
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.ejection import EjectionPolicy
from domain.errors import GatewayError, UpstreamError, UpstreamRejected, UpstreamTimeout, UpstreamUnavailable
from domain.records import RequestRecord
from domain.replicas import ReplicaState
from domain.routing import ModelRouter
from domain.upstream_failures import FailureKind

A, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"
REQUEST = ChatRequest(model="m", messages=[])
USAGE = Usage(input_tokens=1, output_tokens=1)


def failure(kind: FailureKind | None) -> GatewayError:
    if kind is None:
        return UpstreamRejected(400, "bad request")
    if kind in (FailureKind.CONNECT, FailureKind.RESET_BEFORE_HEAD):
        return UpstreamUnavailable("unreachable", failure=kind)
    if kind is FailureKind.FIRST_BYTE_TIMEOUT:
        return UpstreamTimeout("no answer", failure=kind)
    return UpstreamError("failed", failure=kind)


class Scripted:
    """An upstream client (chat, text, embeddings) whose calls on `failing` replicas raise `kind`."""

    def __init__(self, failing: dict[str, FailureKind | None] | None = None) -> None:
        self.failing = failing or {}
        self.calls: list[str | None] = []

    def _maybe_fail(self, replica: str | None) -> None:
        self.calls.append(replica)
        if replica in self.failing:
            raise failure(self.failing[replica])

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        self._maybe_fail(replica)
        return ChatResponse(id="c", model=request.model, created=0, content=[TextPart(text="hi")],
                            finish_reason="end_turn", usage=USAGE)

    @asynccontextmanager
    async def open_stream(self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None
                          ) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        self._maybe_fail(replica)

        async def batches() -> AsyncIterator[ChunkBatch]:
            yield [StreamChunk(events=[TextDelta(text="hi")])]

        yield batches()

    async def count_tokens(self, request: ChatRequest) -> int:
        return 1

    async def complete_text(self, request: CompletionRequest, replica: str | None = None) -> Completion:
        self._maybe_fail(replica)
        return Completion(id="t", model=request.model, created=0, text="hi", finish_reason="stop", usage=USAGE)

    @asynccontextmanager
    async def open_text_stream(self, request: CompletionRequest, replica: str | None = None
                               ) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        self._maybe_fail(replica)

        async def batches() -> AsyncIterator[ChunkBatch]:
            yield [StreamChunk(events=[TextDelta(text="hi")])]

        yield batches()

    async def embed(self, request: EmbeddingRequest, replica: str | None = None) -> Embeddings:
        self._maybe_fail(replica)
        return Embeddings(model=request.model, vectors=[[0.0]], usage=Usage(input_tokens=1, output_tokens=0))


def setup(
    client: Scripted, replicas: tuple[str, ...] = (A, B), policy: EjectionPolicy | None = None, per_replica: int = 4,
) -> tuple[ChatService, InMemoryAdmissionGate, ReplicaCare, list[tuple[str, str]]]:
    clock = SystemClock()
    gate = InMemoryAdmissionGate(
        {"up": AdmissionPolicy(max_in_flight=8, queue_depth=4, queue_timeout_seconds=5)}, clock,
        replica_limits={"up": per_replica})
    ejected: list[tuple[str, str]] = []
    care = ReplicaCare(gate, clock, {"up": policy or EjectionPolicy()}, [lambda u, a: ejected.append((u, a))])
    gate.set_replicas("up", replicas)
    care.set_ready("up", frozenset(replicas))
    service = ChatService(ModelRouter({"up": ["m"]}), {"up": client}, gate, 1.0, clock, care=care)
    return service, gate, care, ejected


def states(gate: InMemoryAdmissionGate) -> dict[str, ReplicaState]:
    return {r.address: r.state for r in gate.replicas("up")}


async def chat(service: ChatService, stream: bool = False) -> RequestRecord:
    record = RequestRecord(request_id="r", surface="v1", route="/", method="POST", status=0, duration_seconds=0)
    if stream:
        async for _ in service.stream(REQUEST, record=record):
            pass
    else:
        await service.complete(REQUEST, record=record)
    return record


@pytest.mark.parametrize("kind", [FailureKind.CONNECT, FailureKind.RESET_BEFORE_HEAD, FailureKind.UNAVAILABLE])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_that_never_started_is_sent_once_to_another_replica(kind: FailureKind, stream: bool) -> None:
    client = Scripted({A: kind})
    service, gate, _, _ = setup(client)
    record = await chat(service, stream)
    assert client.calls == [A, B]
    assert (record.endpoint, record.retried_from) == ("10.0.0.2:8080", "10.0.0.1:8080")
    assert gate.snapshot("up").in_use == 0 and all(r.in_flight == 0 for r in gate.replicas("up"))


@pytest.mark.parametrize("kind", [FailureKind.FIRST_BYTE_TIMEOUT, FailureKind.SERVER_ERROR,
                                  FailureKind.MALFORMED_HEAD, FailureKind.AFTER_HEAD, None])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_that_may_have_started_is_never_sent_again(kind: FailureKind | None, stream: bool) -> None:
    client = Scripted({A: kind})
    service, gate, _, _ = setup(client)
    with pytest.raises(GatewayError) as raised:
        await chat(service, stream)
    assert raised.value.failure is kind and client.calls == [A]
    assert gate.snapshot("up").in_use == 0


async def test_with_no_other_replica_free_the_first_error_is_the_answer() -> None:
    client = Scripted({A: FailureKind.CONNECT})
    service, gate, _, _ = setup(client, replicas=(A,))
    with pytest.raises(UpstreamUnavailable):
        await chat(service)
    assert client.calls == [A] and gate.snapshot("up").in_use == 0


async def test_the_retry_is_one_retry() -> None:
    client = Scripted({A: FailureKind.CONNECT, B: FailureKind.CONNECT})
    service, gate, _, _ = setup(client, replicas=(A, B, C))
    record = RequestRecord(request_id="r", surface="v1", route="/", method="POST", status=0, duration_seconds=0)
    with pytest.raises(UpstreamUnavailable):
        await service.complete(REQUEST, record=record)
    assert client.calls == [A, B] and record.retried_from == "10.0.0.1:8080"
    assert gate.snapshot("up").in_use == 0


async def test_consecutive_failures_eject_and_the_ejection_ends_on_time_then_doubles() -> None:
    client = Scripted({A: FailureKind.SERVER_ERROR})
    policy = EjectionPolicy(consecutive_failures=3, base_ejection_seconds=0.2, max_ejection_seconds=1.0)
    service, gate, care, ejected = setup(client, replicas=(A, B, C), policy=policy)
    for _ in range(6):  # A gets every other call until it is ejected (A, B, C rotate)
        try:
            await chat(service)
        except UpstreamError:
            pass
    assert client.calls.count(A) == 2 and ejected == []
    for _ in range(3):
        try:
            await chat(service)
        except UpstreamError:
            pass
    assert ejected == [("up", A)] and states(gate)[A] is ReplicaState.EJECTED and care.ejected("up") == {A}
    assert gate.snapshot("up").limit == 8  # the cap of 8 stays under the 2 x 4 of the others
    calls = len(client.calls)
    for _ in range(4):
        await chat(service)
    assert A not in client.calls[calls:]
    await asyncio.sleep(0.3)  # its 0.2 s are over: the timer told the gate
    assert states(gate)[A] is ReplicaState.READY and care.ejected("up") == frozenset()
    for _ in range(9):  # still failing: ejected again, now for 0.4 s
        try:
            await chat(service)
        except UpstreamError:
            pass
    assert ejected == [("up", A)] * 2 and states(gate)[A] is ReplicaState.EJECTED
    await asyncio.sleep(0.3)
    assert states(gate)[A] is ReplicaState.EJECTED  # twice as long this time
    await asyncio.sleep(0.2)
    assert states(gate)[A] is ReplicaState.READY
    care.close()


async def test_a_success_resets_the_count_and_a_4xx_is_no_failure() -> None:
    client = Scripted({A: FailureKind.SERVER_ERROR})
    policy = EjectionPolicy(consecutive_failures=2, base_ejection_seconds=10, max_ejection_seconds=10)
    _, gate, care, ejected = setup(client, replicas=(A, B, C), policy=policy)
    care.failed("up", A, FailureKind.SERVER_ERROR)
    care.succeeded("up", A)
    care.failed("up", A, FailureKind.SERVER_ERROR)
    for _ in range(10):
        care.failed("up", A, None)  # a 4xx: the client's fault
    care.failed("up", A, FailureKind.AFTER_HEAD)  # a 2xx head, then the body failed: a success
    care.failed("up", A, FailureKind.SERVER_ERROR)
    assert ejected == [] and states(gate)[A] is ReplicaState.READY
    care.failed("up", A, FailureKind.SERVER_ERROR)
    assert ejected == [("up", A)] and states(gate)[A] is ReplicaState.EJECTED
    care.close()


async def test_the_last_eligible_replica_is_never_ejected() -> None:
    client = Scripted({A: FailureKind.SERVER_ERROR, B: FailureKind.SERVER_ERROR})
    policy = EjectionPolicy(consecutive_failures=2, base_ejection_seconds=10, max_ejection_seconds=10,
                            max_ejection_percent=100)
    service, gate, care, ejected = setup(client, policy=policy)
    for _ in range(12):
        with pytest.raises(UpstreamError):
            await chat(service)
    assert len(ejected) == 1
    assert sorted(s.value for s in states(gate).values()) == ["ejected", "ready"]
    care.close()


async def test_a_discovery_answer_without_the_others_ends_the_ejection() -> None:
    policy = EjectionPolicy(consecutive_failures=1, base_ejection_seconds=10, max_ejection_seconds=10)
    _, gate, care, _ = setup(Scripted(), replicas=(A, B), policy=policy)
    care.failed("up", A, FailureKind.CONNECT)
    assert states(gate)[A] is ReplicaState.EJECTED
    gate.set_replicas("up", [A])
    care.set_ready("up", frozenset({A}))  # B left: A is the last one, it serves again
    assert states(gate)[A] is ReplicaState.READY and care.ejected("up") == frozenset()
    care.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_text_completions_and_embeddings_retry_too(stream: bool) -> None:
    client = Scripted({A: FailureKind.CONNECT})
    chat_service, gate, care, _ = setup(client)
    del chat_service
    clock = SystemClock()
    completions = CompletionService(ModelRouter({"up": ["m"]}), {"up": client}, gate, clock, care=care)
    embeddings = EmbeddingService(ModelRouter({"up": ["m"]}), {"up": client}, gate, clock, care=care)
    record = RequestRecord(request_id="r", surface="v1", route="/", method="POST", status=0, duration_seconds=0)
    if stream:
        async for _ in completions.stream(CompletionRequest(model="m", prompt=["hi"]), record=record):
            pass
    else:
        await completions.complete(CompletionRequest(model="m", prompt=["hi"]), record=record)
    assert record.retried_from == "10.0.0.1:8080" and record.endpoint == "10.0.0.2:8080"
    record = RequestRecord(request_id="e", surface="v1", route="/", method="POST", status=0, duration_seconds=0)
    await embeddings.embed(EmbeddingRequest(model="m", inputs=["hi"]), record=record)
    assert record.retried_from == "10.0.0.1:8080"
    assert client.calls == [A, B, A, B]
    assert gate.snapshot("up").in_use == 0
