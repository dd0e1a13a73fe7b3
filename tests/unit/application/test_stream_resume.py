"""A stream whose replica breaks mid-answer goes on on another replica (`application.resume`).

The in-process gate with two replicas; a scripted upstream client plays the outbound adapter's
part of the contract: it fills the request's `TokenTrail` as it streams, marks the break on the
replicas the test names, and continues the answer from the trail's vouched ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from application.chat import ChatService
from application.replica_care import ReplicaCare
from application.resume import Resumes
from domain.admission.policy import AdmissionPolicy
from domain.canonical import (
    ChatRequest,
    ChatResponse,
    ChunkBatch,
    Finish,
    Message,
    MessageStart,
    StreamChunk,
    StreamError,
    TextDelta,
    TextPart,
    Usage,
    UsageReport,
)
from domain.completions import CompletionRequest
from domain.errors import UpstreamUnavailable
from domain.records import RequestRecord
from domain.resume import TokenTrail
from domain.routing import ModelRouter
from domain.upstream_failures import FailureKind

A, B = "http://10.0.0.1:8080", "http://10.0.0.2:8080"
WORDS = ["alpha", " bravo", " charlie", " delta", " echo", " foxtrot"]
PROMPT = [11, 12]
REQUEST = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])])


class Replicas:
    """The answer is WORDS, token i has id 100 + i. `dies`: replica -> tokens it sends before its
    connection breaks (each time it is called)."""

    def __init__(self, dies: dict[str, int] | None = None, slow: float = 0.0, gone: set[str] | None = None,
                 mute: set[str] | None = None) -> None:
        self.dies = dies or {}
        self.gone = gone or set()  # replicas that refuse every connection after their first stream
        self.mute = mute or set()  # replicas whose streams break after the head, before the first payload
        self.calls: list[tuple[str, str | None, list[int]]] = []  # (kind, replica, prompt sent)
        self.slow = slow

    async def _words(self, start: int, replica: str | None, trail: TokenTrail | None) -> AsyncIterator[ChunkBatch]:
        """The words from `start` on, noted on the trail as each is sent; then the break or the end."""
        stop = len(WORDS)
        if replica in self.dies:
            stop = min(stop, start + self.dies[replica])
        for i in range(start, stop):
            await asyncio.sleep(self.slow)
            if trail is not None:
                trail.note([100 + i], True)
            yield [StreamChunk(events=[TextDelta(text=WORDS[i])])]
        if stop < len(WORDS):
            if trail is not None:
                trail.broken = "connection failed mid-answer"
            yield [StreamChunk(events=[StreamError(kind="upstream-error", message="broke", status=502)])]
        else:
            yield [StreamChunk(events=[Finish(reason="end_turn"),
                                       UsageReport(usage=Usage(input_tokens=2, output_tokens=len(WORDS)))])]

    @asynccontextmanager
    async def open_stream(self, request: ChatRequest, replica: str | None = None, heartbeat: float | None = None,
                          trail: TokenTrail | None = None) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        self.calls.append(("chat", replica, []))
        if replica in self.mute:
            if trail is not None:
                trail.broken = "connection failed mid-answer"

            async def nothing() -> AsyncIterator[ChunkBatch]:
                yield [StreamChunk(events=[StreamError(kind="upstream-error", message="broke", status=502)])]

            yield nothing()
            return
        if trail is not None:
            trail.prompt = list(PROMPT)

        async def batches() -> AsyncIterator[ChunkBatch]:
            yield [StreamChunk(events=[MessageStart(id="c", model="m", created=0)])]
            async for batch in self._words(0, replica, trail):
                yield batch

        yield batches()

    @asynccontextmanager
    async def open_continuation(self, request: ChatRequest | CompletionRequest, trail: TokenTrail,
                                replica: str | None = None, heartbeat: float | None = None,
                                resumed_from: str | None = None) -> AsyncIterator[AsyncIterator[ChunkBatch]]:
        prompt = trail.continuation_prompt()
        self.calls.append(("continuation", replica, prompt))
        if replica in self.gone:
            raise UpstreamUnavailable("unreachable", failure=FailureKind.CONNECT)
        start = len(prompt) - len(PROMPT)
        yield self._words(start, replica, trail)

    async def complete(self, request: ChatRequest, replica: str | None = None) -> ChatResponse:
        raise AssertionError("a resumable plain request is asked as a stream")

    async def count_tokens(self, request: ChatRequest) -> int:
        return 1


def setup(client: Replicas, max_resumes: int | None = 2, per_replica: int = 4, wait: float = 0.3
          ) -> tuple[ChatService, InMemoryAdmissionGate, list[tuple[str, str]]]:
    """`max_resumes` None: the upstream does not resume."""
    clock = SystemClock()
    gate = InMemoryAdmissionGate(
        {"up": AdmissionPolicy(max_in_flight=8, queue_depth=4, queue_timeout_seconds=5)}, clock,
        replica_limits={"up": per_replica})
    care = ReplicaCare(gate, clock)
    gate.set_replicas("up", (A, B))
    care.set_ready("up", frozenset((A, B)))
    outcomes: list[tuple[str, str]] = []
    limits = {} if max_resumes is None else {"up": max_resumes}
    resumes = Resumes(limits, [lambda u, o: outcomes.append((u, o))], wait=wait)
    service = ChatService(ModelRouter({"up": ["m"]}), {"up": client}, gate, 1.0, clock, care=care, resumes=resumes)
    return service, gate, outcomes


def record() -> RequestRecord:
    return RequestRecord(request_id="r", surface="v1", route="/", method="POST", status=0, duration_seconds=0)


async def events_of(service: ChatService, request: ChatRequest = REQUEST, rec: RequestRecord | None = None) -> list:
    seen = []
    async for batch in service.stream(request, record=rec):
        for chunk in batch:  # type: ignore[union-attr]
            seen.extend(chunk.events)
    return seen


def broke(events: list) -> bool:
    """The stream ended with an error (an estimated usage report may follow it)."""
    return any(isinstance(e, StreamError) for e in events)


def text_of(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_a_stream_broken_on_one_replica_goes_on_on_the_other_from_where_it_broke() -> None:
    client = Replicas(dies={A: 3})
    service, gate, outcomes = setup(client)
    rec = record()
    events = await events_of(service, rec=rec)
    assert text_of(events) == "".join(WORDS)
    assert sum(isinstance(e, MessageStart) for e in events) == 1
    assert sum(isinstance(e, Finish) for e in events) == 1
    assert not any(isinstance(e, StreamError) for e in events)
    assert client.calls == [("chat", A, []), ("continuation", B, [*PROMPT, 100, 101, 102])]
    assert (rec.resumed, rec.resumed_tokens, rec.endpoint) == (1, 5, "10.0.0.2:8080")
    assert outcomes == [("up", "resumed")]
    assert gate.snapshot("up").in_use == 0


async def test_a_plain_request_broken_mid_answer_is_answered_whole() -> None:
    client = Replicas(dies={A: 2})
    service, gate, outcomes = setup(client)
    rec = record()
    answer = await service.complete(REQUEST, record=rec)
    assert answer.content == [TextPart(text="".join(WORDS))]
    assert answer.finish_reason == "end_turn"
    assert rec.resumed == 1 and outcomes == [("up", "resumed")]
    assert gate.snapshot("up").in_use == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_a_break_before_the_first_payload_sends_the_request_itself_again(stream: bool) -> None:
    # A server sends its head at once and its first chunk (with the prompt's ids) once the prompt
    # is read: killed in between, nothing of the answer was relayed, and no ids are known.
    client = Replicas(mute={A})
    service, gate, outcomes = setup(client)
    rec = record()
    if stream:
        events = await events_of(service, rec=rec)
        assert text_of(events) == "".join(WORDS) and not broke(events)
        assert sum(isinstance(e, MessageStart) for e in events) == 1
    else:
        answer = await service.complete(REQUEST, record=rec)
        assert answer.content == [TextPart(text="".join(WORDS))]
    assert client.calls == [("chat", A, []), ("chat", B, [])]
    assert (rec.resumed, rec.resumed_tokens, rec.endpoint) == (1, 0, "10.0.0.2:8080")
    assert outcomes == [("up", "resumed")]
    assert gate.snapshot("up").in_use == 0


async def test_a_break_before_the_first_payload_is_sent_again_at_most_max_resumes_times() -> None:
    client = Replicas(mute={A, B})
    service, gate, outcomes = setup(client, max_resumes=2)
    events = await events_of(service)
    assert broke(events) and text_of(events) == ""
    assert [c[:2] for c in client.calls] == [("chat", A), ("chat", B), ("chat", A)]
    assert outcomes == [("up", "resumed"), ("up", "resumed"), ("up", "not_resumable")]
    assert gate.snapshot("up").in_use == 0


async def test_a_continuation_that_breaks_too_resumes_again_until_max_resumes() -> None:
    client = Replicas(dies={A: 2, B: 1})
    service, _, outcomes = setup(client, max_resumes=2)
    rec = record()
    events = await events_of(service, rec=rec)
    # A: alpha bravo, breaks; B: charlie, breaks; A: delta echo, breaks; no resumes left.
    assert text_of(events) == "".join(WORDS[:5])
    assert broke(events)
    assert [c[1] for c in client.calls] == [A, B, A]
    assert outcomes == [("up", "resumed"), ("up", "resumed"), ("up", "not_resumable")]
    assert rec.resumed == 2


async def test_without_another_replica_with_room_the_replica_that_broke_is_asked_to_go_on() -> None:
    client = Replicas(dies={B: 3})  # the connection breaks, the replica lives
    service, gate, outcomes = setup(client, per_replica=1)
    blocker = await gate.enter("up")  # A's one slot is taken: the request goes to B, which breaks
    assert not blocker.queued and blocker.replica == A  # type: ignore[union-attr]
    events = await events_of(service)
    assert text_of(events) == "".join(WORDS) and not broke(events)
    assert [c[1] for c in client.calls] == [B, B]
    assert outcomes == [("up", "resumed")]
    await blocker.release()  # type: ignore[union-attr]
    assert gate.snapshot("up").in_use == 0


async def test_a_gone_replica_with_no_room_elsewhere_is_given_up_after_the_wait() -> None:
    client = Replicas(dies={B: 2}, gone={B})
    service, gate, outcomes = setup(client, per_replica=1, wait=0.6)
    blocker = await gate.enter("up")
    events = await events_of(service)
    assert text_of(events) == "".join(WORDS[:2]) and broke(events)
    assert 2 <= sum(c[0] == "continuation" for c in client.calls) <= 4  # tried again, for the wait only
    assert outcomes == [("up", "failed")]
    await blocker.release()  # type: ignore[union-attr]
    assert gate.snapshot("up").in_use == 0


async def test_a_gone_replica_is_left_for_one_that_frees_a_slot_meanwhile() -> None:
    client = Replicas(dies={B: 2}, gone={B})
    service, gate, outcomes = setup(client, per_replica=1, wait=5)
    blocker = await gate.enter("up")

    async def free_a_soon() -> None:
        await asyncio.sleep(0.4)
        await blocker.release()  # type: ignore[union-attr]

    freeing = asyncio.create_task(free_a_soon())
    events = await events_of(service)
    await freeing
    assert text_of(events) == "".join(WORDS) and not broke(events)
    assert client.calls[-1][:2] == ("continuation", A)
    assert outcomes == [("up", "resumed")]
    assert gate.snapshot("up").in_use == 0


async def test_a_request_that_cannot_be_resumed_ends_as_before_and_is_counted() -> None:
    client = Replicas(dies={A: 2})
    service, _, outcomes = setup(client)
    request = ChatRequest(model="m", messages=REQUEST.messages, stop=["x"])
    events = await events_of(service, request)
    assert text_of(events) == "".join(WORDS[:2]) and broke(events)
    assert client.calls == [("chat", A, [])]
    assert outcomes == [("up", "not_resumable")]


async def test_a_client_that_hangs_up_during_the_continuation_frees_its_slot() -> None:
    client = Replicas(dies={A: 1}, slow=0.05)
    service, gate, _ = setup(client)
    stream = service.stream(REQUEST)
    seen = 0
    async for _ in stream:
        seen += 1
        if any(c[0] == "continuation" for c in client.calls):
            break
    await stream.aclose()
    assert gate.snapshot("up").in_use == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_without_resume_is_not_watched(stream: bool) -> None:
    client = Replicas(dies={A: 2})
    service, _, outcomes = setup(client, max_resumes=None)
    if stream:
        events = await events_of(service)
        assert broke(events)
    else:
        with pytest.raises(AssertionError):
            await service.complete(REQUEST)
    assert outcomes == []


async def test_a_break_after_the_last_token_only_needs_the_finish() -> None:
    client = Replicas(dies={A: 3})
    service, gate, outcomes = setup(client)
    request = ChatRequest(model="m", messages=REQUEST.messages, max_tokens=3)
    events = await events_of(service, request)
    assert text_of(events) == "".join(WORDS[:3]) and not broke(events)
    assert [e.reason for e in events if isinstance(e, Finish)] == ["max_tokens"]
    assert [(e.usage.input_tokens, e.usage.output_tokens) for e in events if isinstance(e, UsageReport)] == [(2, 3)]
    assert [c[0] for c in client.calls] == ["chat"]  # nothing left to ask another replica
    assert outcomes == [("up", "resumed")]
    assert gate.snapshot("up").in_use == 0
