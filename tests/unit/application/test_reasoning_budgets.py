"""Thinking budgets per upstream (`application.reasoning`), through `ChatService` with fakes of its
ports: an upstream that refuses a budget, as vLLM without a reasoning parser does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from tests.unit.application.test_chat_service import CHUNKS, FakeGate

from application.chat import ChatService
from application.reasoning import ReasoningBudgets
from domain.canonical import ChatRequest, ChatResponse, ReasoningConfig, StreamChunk
from domain.errors import ThinkingBudgetRefused
from domain.reasoning import RECHECK_SECONDS, ReasoningMode
from domain.records import RequestRecord
from domain.routing import ModelRouter

REFUSAL = "thinking_token_budget is set but reasoning_config is not configured."


class Clock:
    def __init__(self) -> None:
        self.time = 1000.0

    def now(self) -> float:
        return self.time


class Refusing:
    """An upstream that refuses every request carrying a thinking budget (or, `serves`, none)."""

    def __init__(self, serves: bool = False) -> None:
        self.serves = serves
        self.sent: list[int | None] = []  # each call's budget, refused ones included
        self.closed = 0

    def _check(self, request: ChatRequest) -> None:
        budget = request.reasoning.budget_tokens if request.reasoning else None
        self.sent.append(budget)
        if budget is not None and not self.serves:
            raise ThinkingBudgetRefused(REFUSAL)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self._check(request)
        return ChatResponse(id="x", model=request.model, created=0, content=[], finish_reason="end_turn")

    @asynccontextmanager
    async def open_stream(
        self, request: ChatRequest, heartbeat: float | None = None
    ) -> AsyncIterator[AsyncIterator[list[StreamChunk]]]:
        self._check(request)

        async def chunks() -> AsyncIterator[list[StreamChunk]]:
            for chunk in CHUNKS:
                yield [chunk]

        try:
            yield chunks()
        finally:
            self.closed += 1


def chat(upstream: Refusing, mode: ReasoningMode | None, clock: Clock) -> ChatService:
    budgets = ReasoningBudgets({} if mode is None else {"up": mode}, clock)
    return ChatService(ModelRouter({"up": ["m"]}), {"up": upstream}, FakeGate(free=100), queue_update_interval=0.01,
                       clock=clock, budgets=budgets)  # fmt: skip


def thinking(budget: int | None = 512, stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=[], stream=stream, reasoning=ReasoningConfig(enabled=True,
                                                                                         budget_tokens=budget))


def record() -> RequestRecord:
    return RequestRecord(request_id="r", surface="llm", route="/", method="POST", status=0, duration_seconds=0)


async def run(service: ChatService, request: ChatRequest, rec: RequestRecord) -> None:
    if request.stream:
        items = [item async for item in service.stream(request, record=rec)]
        assert items == [[c] for c in CHUNKS]
    else:
        await service.complete(request, rec)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["auto", None])  # None: an upstream the map does not name is "auto"
async def test_auto_sends_a_refused_request_again_without_the_budget_then_holds_budgets_back(
    stream: bool, mode: ReasoningMode | None, caplog: pytest.LogCaptureFixture
) -> None:
    upstream, clock = Refusing(), Clock()
    service = chat(upstream, mode, clock)
    records = [record() for _ in range(3)]
    with caplog.at_level(logging.WARNING, "gateway.upstream"):
        await run(service, thinking(stream=stream), records[0])
        await run(service, thinking(stream=stream), records[1])
        clock.time += RECHECK_SECONDS  # tried again: a server restarted with a parser would take it
        await run(service, thinking(stream=stream), records[2])
    assert upstream.sent == [512, None, None, 512, None]
    assert [r.thinking_budget_dropped for r in records] == [True, True, True]
    assert [r.message.startswith("upstream up does not serve reasoning") for r in caplog.records] == [True, True]
    if stream:
        assert upstream.closed == 3  # every opened stream closed, the refused ones never opened


@pytest.mark.parametrize("stream", [False, True])
async def test_true_relays_the_refusal(stream: bool) -> None:
    upstream, rec = Refusing(), record()
    with pytest.raises(ThinkingBudgetRefused, match="reasoning_config is not configured"):
        await run(chat(upstream, True, Clock()), thinking(stream=stream), rec)
    assert upstream.sent == [512] and rec.thinking_budget_dropped is False


@pytest.mark.parametrize("stream", [False, True])
async def test_false_never_sends_a_budget(stream: bool) -> None:
    upstream, rec = Refusing(), record()
    await run(chat(upstream, False, Clock()), thinking(stream=stream), rec)
    assert upstream.sent == [None] and rec.thinking_budget_dropped is True


@pytest.mark.parametrize("mode", ["auto", True, False])
async def test_a_request_without_a_budget_is_sent_as_it_came(mode: ReasoningMode) -> None:
    upstream, rec = Refusing(), record()
    await run(chat(upstream, mode, Clock()), thinking(budget=None), rec)
    assert upstream.sent == [None] and rec.thinking_budget_dropped is False


async def test_a_served_budget_is_sent_every_time() -> None:
    upstream = Refusing(serves=True)
    service = chat(upstream, "auto", Clock())
    for stream in (False, True, False):
        await run(service, thinking(stream=stream), record())
    assert upstream.sent == [512, 512, 512]
