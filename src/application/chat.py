"""The one use case every dialect drives: route -> admit -> call upstream -> release.

Dialects decode their wire format into a `ChatRequest` and render what comes back;
everything between (which upstream, whether a slot is free, how long to wait, giving
the slot back on every path) happens here, once, for all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

import msgspec

from application.consumer_limits import ConsumerLimits, Door
from domain.canonical import ChatRequest, ChatResponse, ChunkBatch, QueuePosition, StreamChunk, UsageReport
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import AdmissionUnavailable, GatewayError
from domain.records import RequestRecord
from domain.routing import ModelRouter
from ports.admission import AdmissionGate, QueueTicket, SlotLease
from ports.clock import Clock
from ports.telemetry import NullTracer, Span, Tracer
from ports.upstream import UpstreamClient

T = TypeVar("T")


_LEASE_LOST_MESSAGE = "This request's slot was reclaimed by the shared admission ledger; retry."


async def _unless_lost(call: Awaitable[T], lost: asyncio.Event) -> T:
    """Run `call`, aborting it if the slot lease is lost meanwhile.

    A process fenced by the shared ledger (its heartbeat lapsed, its slots were handed
    to others) must stop using them at once, or the cap would be exceeded silently.
    """
    work = asyncio.ensure_future(call)
    watch = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled() and lost.is_set():
        raise AdmissionUnavailable(1, _LEASE_LOST_MESSAGE)
    return work.result()


class ChatService:
    """Serves canonical chat requests for every inbound dialect.

    Client hang-ups arrive as task cancellation: the inbound adapter cancels the task
    running `complete` or consuming `stream`, and every `finally` here gives the slot
    back and aborts the upstream call.
    """

    __slots__ = ("_clock", "_consumers", "_gate", "_router", "_tracer", "_update_interval", "_upstreams")

    def __init__(
        self,
        router: ModelRouter,
        upstreams: Mapping[str, UpstreamClient],
        gate: AdmissionGate,
        queue_update_interval: float,
        clock: Clock,
        tracer: Tracer | None = None,
        consumers: ConsumerLimits | None = None,
    ) -> None:
        self._router = router
        self._consumers = consumers or ConsumerLimits()
        self._upstreams = upstreams
        self._gate = gate
        self._update_interval = queue_update_interval
        self._clock = clock
        self._tracer = tracer or NullTracer()

    def models(self) -> list[str]:
        return self._router.models()

    async def admit(self, consumer: Consumer, record: RequestRecord | None = None) -> Door:
        """A consumer's request count and in-flight slot, before its body is read (the edge
        calls it for every request that reaches a model); release the `Door` at the end."""
        return await self._consumers.admit(consumer, record)

    def upstream_for(self, model: str) -> str:
        """The upstream key serving `model`; raises `ModelNotFound`."""
        return self._router.upstream_for(model)

    async def complete(
        self, request: ChatRequest, record: RequestRecord | None = None, consumer: Consumer = ANONYMOUS
    ) -> ChatResponse:
        upstream, request = self._route(request, record)
        async with self._consumers.turn(consumer, request, record) as turn:
            lease = await self._admit_quietly(upstream, record, consumer)
            turn.reached_upstream = True
            try:
                response = await _unless_lost(self._upstreams[upstream].complete(request), lease.lost)
            finally:
                await lease.release()
            usage = response.usage
            if usage.input_tokens or usage.output_tokens:
                turn.meter.reported = usage
            else:  # an upstream that reports no usage: charged (and reported) by estimate, never 0
                turn.meter.feed_answer(response.content)
                response = msgspec.structs.replace(response, usage=turn.used())
            return response

    async def stream(
        self, request: ChatRequest, *, report_queue: bool = False, record: RequestRecord | None = None,
        consumer: Consumer = ANONYMOUS,
    ) -> AsyncIterator[QueuePosition | ChunkBatch]:
        """Stream a request's answer, preceded by queue positions if `report_queue`.

        Failures before the first item is yielded are raised before anything reaches
        the client, so the dialect can still answer with a proper HTTP status. An
        upstream that reports no usage gets an estimated `UsageReport` as the last batch.
        """
        upstream, request = self._route(request, record)
        async with self._consumers.turn(consumer, request, record) as turn:
            span, started = self._tracer.start("gateway.admission"), self._clock.now()
            entry = await self._enter(upstream, span, consumer)
            if entry.queued:
                ticket: QueueTicket = entry  # type: ignore[assignment]
                span.set("gateway.queue.position_on_arrival", ticket.position())
                if report_queue:
                    granted: SlotLease | None = None
                    try:
                        async for item in self._positions(upstream, ticket):
                            if isinstance(item, QueuePosition):
                                yield item
                            else:
                                granted = item
                    except BaseException as error:  # hang-up while queued, including GeneratorExit
                        await ticket.cancel()
                        self._admitted(span, started, record, error)
                        raise
                    assert granted is not None
                    lease = granted
                else:
                    lease = await self._wait(ticket, span, started, record)
                self._admitted(span, started, record, None, "queued")
            else:
                lease = entry  # type: ignore[assignment]
                self._admitted(span, started, record, None, "admitted")
            lost = lease.lost  # only a shared ledger can lose a lease (fencing)
            meter = turn.meter
            turn.reached_upstream = True
            try:
                async with self._upstreams[upstream].open_stream(request) as batches:
                    async for batch in batches:
                        if lost.is_set():
                            raise AdmissionUnavailable(1, _LEASE_LOST_MESSAGE)
                        for chunk in batch:
                            meter.feed(chunk.events)
                        yield batch
            finally:
                await lease.release()
            if meter.reported is None:
                yield [StreamChunk(events=[UsageReport(usage=meter.usage())])]

    async def count_tokens(self, request: ChatRequest) -> int:
        upstream, request = self._route(request, None)
        return await self._upstreams[upstream].count_tokens(request)

    # --- admission ---------------------------------------------------------------

    def _route(self, request: ChatRequest, record: RequestRecord | None) -> tuple[str, ChatRequest]:
        """The upstream, and the request as that upstream is called: a model alias becomes the
        upstream's own model name (the dialect still answers with the name the client used)."""
        upstream, model = self._router.resolve(request.model)
        if record is not None:
            record.upstream = upstream
            record.model = request.model
        if model != request.model:
            request = msgspec.structs.replace(request, model=model)
        return upstream, request

    async def _enter(self, upstream: str, span: Span, consumer: Consumer) -> SlotLease | QueueTicket:
        span.set("gateway.upstream", upstream)
        try:
            return await self._gate.enter(upstream, consumer)
        except GatewayError as error:
            span.set("gateway.admission.outcome", error.kind)
            span.end(error.kind)
            raise

    def _admitted(
        self, span: Span, started: float, record: RequestRecord | None,
        error: BaseException | None, outcome: str = "abandoned",
    ) -> None:
        """Close the admission span and note the queue wait, however admission ended."""
        waited = self._clock.now() - started
        if record is not None:
            record.queue_wait_seconds = waited
        if isinstance(error, GatewayError):
            outcome = error.kind
        span.set("gateway.admission.outcome", outcome)
        span.set("gateway.queue.wait_seconds", waited)
        span.end(None if error is None or outcome == "abandoned" else outcome)

    async def _admit_quietly(self, upstream: str, record: RequestRecord | None, consumer: Consumer) -> SlotLease:
        span, started = self._tracer.start("gateway.admission"), self._clock.now()
        entry = await self._enter(upstream, span, consumer)
        if not entry.queued:
            self._admitted(span, started, record, None, "admitted")
            return entry  # type: ignore[return-value]
        ticket: QueueTicket = entry  # type: ignore[assignment]
        span.set("gateway.queue.position_on_arrival", ticket.position())
        lease = await self._wait(ticket, span, started, record)
        self._admitted(span, started, record, None, "queued")
        return lease

    async def _wait(
        self, ticket: QueueTicket, span: Span, started: float, record: RequestRecord | None
    ) -> SlotLease:
        try:
            while True:
                lease = await ticket.wait(3600.0)
                if lease is not None:
                    return lease
        except BaseException as error:
            await ticket.cancel()
            self._admitted(span, started, record, error)
            raise

    async def _positions(
        self, upstream: str, ticket: QueueTicket
    ) -> AsyncIterator[QueuePosition | SlotLease]:
        """The position at once, then at most one update per interval, then the lease.

        A waiter reads its own position from the ledger (O(log n)) when its own timer
        fires; nothing is pushed to waiters when others leave the queue, so draining a
        queue of n waiters costs at most n frames per interval, not O(n^2) frames.
        The caller cancels the ticket if this generator is abandoned.
        """
        last = ticket.position()
        yield QueuePosition(position=last, queued=self._gate.snapshot(upstream).queued)
        while True:
            lease = await ticket.wait(self._update_interval)
            if lease is not None:
                yield lease
                return
            position = ticket.position()
            if position != last:
                last = position
                yield QueuePosition(position=position, queued=self._gate.snapshot(upstream).queued)

