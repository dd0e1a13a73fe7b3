"""The one use case every dialect drives: route -> admit -> call upstream -> release.

Dialects decode their wire format into a `ChatRequest` and render what comes back;
everything between (which upstream, whether a slot is free, how long to wait, giving
the slot back on every path) happens here, once, for all of them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

import msgspec

from application.affinity import NO_WISH, Affinity
from application.collected import answer_of
from application.consumer_limits import ConsumerLimits, Door
from application.reasoning import ReasoningBudgets
from application.replica_care import ReplicaCare
from application.resume import Resumes
from application.service_charge import ServiceCharges
from application.slots import LEASE_LOST_MESSAGE, Slots, route, salted
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, QueuePosition, StreamChunk, UsageReport
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import AdmissionUnavailable
from domain.reasoning import has_budget
from domain.records import RequestRecord
from domain.routing import ModelRouter
from domain.sequences import sequences
from ports.admission import AdmissionGate, QueueTicket, SlotLease
from ports.clock import Clock
from ports.telemetry import Tracer
from ports.upstream import UpstreamClient


class ChatService:
    """Serves canonical chat requests for every inbound dialect.

    Client hang-ups arrive as task cancellation: the inbound adapter cancels the task
    running `complete` or consuming `stream`, and every `finally` here gives the slot
    back and aborts the upstream call.
    """

    __slots__ = (
        "_affinity", "_budgets", "_care", "_charges", "_consumers", "_resumes", "_router", "_slots", "_upstreams",
    )

    def __init__(
        self,
        router: ModelRouter,
        upstreams: Mapping[str, UpstreamClient],
        gate: AdmissionGate,
        queue_update_interval: float,
        clock: Clock,
        tracer: Tracer | None = None,
        consumers: ConsumerLimits | None = None,
        affinity: Affinity | None = None,
        care: ReplicaCare | None = None,
        budgets: ReasoningBudgets | None = None,
        resumes: Resumes | None = None,
    ) -> None:
        self._router = router
        self._affinity = affinity or Affinity()
        self._consumers = consumers or ConsumerLimits()
        self._upstreams = upstreams
        self._slots = Slots(gate, clock, tracer, queue_update_interval)
        self._charges = ServiceCharges(gate, clock)  # token service, on `fairness = "tokens"` upstreams
        self._care = care or ReplicaCare(gate, clock)  # without it: the safe retry, no ejection
        # Thinking budgets only where served (`[upstreams.NAME] reasoning`); without it: every one "auto".
        self._budgets = budgets or ReasoningBudgets({}, clock)
        self._resumes = resumes or Resumes()  # without it: no upstream resumes a broken stream

    def models(self) -> list[str]:
        return self._router.models()

    def admit(self, consumer: Consumer, record: RequestRecord | None = None) -> Coroutine[Any, Any, Door]:
        """A consumer's request count and in-flight slot, before its body is read (the edge
        calls it for every request that reaches a model); release the `Door` at the end.
        `ConsumerLimits.admit`'s coroutine itself: no coroutine of its own to await it."""
        return self._consumers.admit(consumer, record)

    def upstream_for(self, model: str) -> str:
        """The upstream key serving `model`; raises `ModelNotFound`."""
        return self._router.upstream_for(model)

    async def complete(
        self, request: ChatRequest, record: RequestRecord | None = None, consumer: Consumer = ANONYMOUS
    ) -> ChatResponse:
        upstream, request = route(self._router, salted(request, consumer), record)
        affinity = self._affinity
        async with self._consumers.turn(consumer, request, record) as turn:
            # Not awaited at all for an upstream without affinity (no [endpoints], or affinity off).
            wish = await affinity.wish(upstream, request, consumer) if affinity.wanted(upstream) else NO_WISH
            lease, since = await self._slots.admit_quietly(upstream, record, consumer, sequences(request),
                                                           wish.prefer, wish.max_extra)
            turn.reached_upstream = True
            charged = self._charges.meter(turn.meter, request, upstream, consumer)  # None: not metered
            if charged is not None:
                turn.meter = charged
            try:
                client = self._upstreams[upstream]
                budgets = self._budgets
                budgeted = has_budget(request)
                response = await self._resumes.answer(
                    self._care, upstream, request, lease, record,
                    budgets.caller(upstream, request, record, client.complete) if budgeted
                    else functools.partial(client.complete, request),
                    budgets.opener(upstream, request, record, client.open_stream) if budgeted
                    else functools.partial(client.open_stream, request),
                    client, answer_of,
                    functools.partial(affinity.granted, upstream, wish, lease) if wish.chain else None,
                )  # fmt: skip
                usage = response.usage
                if usage.input_tokens or usage.output_tokens:
                    turn.meter.reported = usage
                else:  # an upstream that reports no usage: charged (and reported) by estimate, never 0
                    turn.meter.feed_answer(response.content)
                    response = msgspec.structs.replace(response, usage=turn.used())
            finally:
                if charged is not None:  # before the release: the next dispatch sees it
                    charged.settle()
                await self._slots.release(lease, record, since)
            return response

    async def stream(
        self, request: ChatRequest, *, report_queue: bool = False, record: RequestRecord | None = None,
        consumer: Consumer = ANONYMOUS, heartbeat: float | None = None,
    ) -> AsyncIterator[QueuePosition | ChunkBatch]:
        """Stream a request's answer, preceded by queue positions if `report_queue`.

        Failures before the first item is yielded are raised before anything reaches
        the client, so the dialect can still answer with a proper HTTP status. An
        upstream that reports no usage gets an estimated `UsageReport` as the last batch.

        With `heartbeat` (seconds), an empty batch comes when the stream has been quiet that
        long: in the queue (with `report_queue`; at the first position check after it) and
        between the upstream's reads, so a dialect can keep the connection alive without a
        timer of its own per item. The wait for the upstream's answer head has none (vLLM
        sends it at once).
        """
        upstream, request = route(self._router, salted(request, consumer), record)
        slots = self._slots
        affinity = self._affinity
        async with self._consumers.turn(consumer, request, record) as turn:
            # Not awaited at all for an upstream without affinity (no [endpoints], or affinity off).
            wish = await affinity.wish(upstream, request, consumer) if affinity.wanted(upstream) else NO_WISH
            span, started = slots.start()
            entry = await slots.enter(upstream, span, consumer, sequences(request), wish.prefer, wish.max_extra)
            if entry.queued:
                ticket: QueueTicket = entry  # type: ignore[assignment]
                span.set("gateway.queue.position_on_arrival", ticket.position())
                if report_queue:
                    granted: SlotLease | None = None
                    try:
                        async for item in slots.positions(upstream, ticket, heartbeat):
                            if item is None:
                                yield []  # quiet for `heartbeat` seconds
                            elif isinstance(item, QueuePosition):
                                yield item
                            else:
                                granted = item
                    except BaseException as error:  # hang-up while queued, including GeneratorExit
                        await ticket.cancel()
                        slots.admitted(span, started, record, error)
                        raise
                    assert granted is not None
                    lease = granted
                else:
                    lease = await slots.wait(ticket, span, started, record)
                since = slots.admitted(span, started, record, None, "queued")
            else:
                lease = entry  # type: ignore[assignment]
                since = slots.admitted(span, started, record, None, "admitted")
            # Only a shared ledger can lose a lease (fencing); no look per read at one that cannot.
            lost = lease.lost if lease.losable else None
            charged = self._charges.meter(turn.meter, request, upstream, consumer)  # None: not metered
            if charged is not None:
                turn.meter = charged
            meter = turn.meter
            turn.reached_upstream = True
            try:
                client = self._upstreams[upstream]
                opener = (self._budgets.opener(upstream, request, record, client.open_stream) if has_budget(request)
                          else functools.partial(client.open_stream, request))  # fmt: skip
                if heartbeat is not None:
                    opener = functools.partial(opener, heartbeat=heartbeat)
                opened = functools.partial(affinity.granted, upstream, wish, lease) if wish.chain else None
                async with self._resumes.open(self._care, upstream, request, lease, record, opener, client, opened,
                                              heartbeat) as batches:  # fmt: skip
                    async for batch in batches:
                        if lost is not None and lost.is_set():
                            raise AdmissionUnavailable(1, LEASE_LOST_MESSAGE)
                        meter.feed_batch(batch)
                        yield batch
            finally:
                if charged is not None:  # before the release: the next dispatch sees it
                    charged.settle()
                await slots.release(lease, record, since)
            if meter.reported is None:
                yield [StreamChunk(events=[UsageReport(usage=meter.usage())])]

    async def count_tokens(self, request: ChatRequest, record: RequestRecord | None = None) -> int:
        upstream, request = route(self._router, request, record)
        return await self._upstreams[upstream].count_tokens(request)

