"""Thinking budgets only for upstreams that apply them (`[upstreams.NAME] reasoning`).

A chat request may carry a thinking budget (`/llm` `thinking.budget_tokens`, `/v1`
`thinking_token_budget`); vLLM without a reasoning parser refuses any request that does, before
generating anything (`domain.reasoning`). Per upstream:

- `true`: the budget is sent; a refusal is the answer (a 400 naming vLLM's reason).
- `false`: the budget is never sent.
- `"auto"` (the default): the budget is sent; a refusal makes the request go again at once,
  without it, on the same slot and replica (nothing was generated, nothing reached the client),
  and the upstream's requests go without one from the start for `RECHECK_SECONDS` (logged once).

A request sent without its budget says so on its record (`thinking_budget_dropped`, the access
log); it is otherwise sent as it came: whether to think and an effort level are the chat
template's inputs, which vLLM takes with or without a parser. A request without a budget takes
none of these paths (one attribute test).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

from domain.canonical import ChatRequest
from domain.errors import ThinkingBudgetRefused
from domain.reasoning import RECHECK_SECONDS, BudgetSupport, ReasoningMode, without_budget
from domain.records import RequestRecord
from ports.clock import Clock

log = logging.getLogger("gateway.upstream")

T = TypeVar("T")
Caller = Callable[..., Awaitable[T]]
Opener = Callable[..., AbstractAsyncContextManager[T]]


class ReasoningBudgets:
    """Every upstream's `BudgetSupport` in this process (`"auto"` for one not named), and the
    calls of requests with a budget, shaped for it and, if need be, sent once more."""

    __slots__ = ("_clock", "_support")

    def __init__(self, modes: Mapping[str, ReasoningMode], clock: Clock) -> None:
        self._clock = clock
        self._support = {name: BudgetSupport(mode) for name, mode in modes.items()}

    def caller(
        self, upstream: str, request: ChatRequest, record: RequestRecord | None, call: Caller[T]
    ) -> Caller[T]:
        """`call(request, **kwargs)` as a function of the kwargs (the replica): without the budget
        where none is sent; sent once more without it when the upstream refuses it and may."""

        async def called(**kwargs: Any) -> T:
            sent = self._fit(upstream, request, record)
            if sent is not request:
                return await call(sent, **kwargs)
            try:
                return await call(request, **kwargs)
            except ThinkingBudgetRefused:
                if not self._refused(upstream):
                    raise
            return await call(_dropped(request, record), **kwargs)

        return called

    def opener(
        self, upstream: str, request: ChatRequest, record: RequestRecord | None, open_: Opener[T]
    ) -> Opener[T]:
        """`open_(request, **kwargs)` as a function of the kwargs (replica, heartbeat), as `caller`:
        a refusal is raised while the stream opens, before anything reached the client."""

        @asynccontextmanager
        async def opened(**kwargs: Any) -> AsyncIterator[T]:
            async with AsyncExitStack() as stack:
                sent = self._fit(upstream, request, record)
                try:
                    value = await stack.enter_async_context(open_(sent, **kwargs))
                except ThinkingBudgetRefused:
                    if sent is not request or not self._refused(upstream):
                        raise
                    value = await stack.enter_async_context(open_(_dropped(request, record), **kwargs))
                yield value

        return opened

    def _of(self, upstream: str) -> BudgetSupport:
        support = self._support.get(upstream)
        if support is None:  # upstream names come from the config: a bounded set
            support = self._support[upstream] = BudgetSupport("auto")
        return support

    def _fit(self, upstream: str, request: ChatRequest, record: RequestRecord | None) -> ChatRequest:
        """The request as `upstream` is to be sent it now: without its budget where none is sent."""
        if self._of(upstream).sends(self._clock.now()):
            return request
        return _dropped(request, record)

    def _refused(self, upstream: str) -> bool:
        """Learn a refusal; True when the request is to go again without its budget."""
        support = self._of(upstream)
        now = self._clock.now()
        was_sending = support.sends(now)
        if not support.refused(now):
            return False
        if was_sending:
            log.warning(
                "upstream %s does not serve reasoning: it refused a thinking budget (vLLM without "
                "--reasoning-parser); budgets are not sent to it for %gs (set [upstreams.%s] reasoning = "
                "false to say so, true to relay the refusal)", upstream, RECHECK_SECONDS, upstream,
            )
        return True


def _dropped(request: ChatRequest, record: RequestRecord | None) -> ChatRequest:
    if record is not None:
        record.thinking_budget_dropped = True
    return without_budget(request)

