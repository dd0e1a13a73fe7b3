"""How every use case gets its upstream slot: route, enter the gate, wait, give it back.

`ChatService`, `CompletionService` and `EmbeddingService` call upstreams for different
operations, but reach them the same way: the model names the upstream (an alias becomes
the upstream's own name), the upstream's one gate admits the request at once or queues it
(FIFO or fair), a hang-up while queued leaves the queue, the admission span and the
record note how it went, and a lease lost to the shared ledger aborts the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import msgspec

from domain.canonical import QueuePosition
from domain.consumers import Consumer
from domain.errors import AdmissionUnavailable, GatewayError
from domain.records import RequestRecord
from domain.replicas import endpoint_of
from domain.routing import ModelRouter
from ports.admission import AdmissionGate, QueueTicket, SlotLease
from ports.clock import Clock
from ports.telemetry import NullTracer, Span, Tracer

T = TypeVar("T")
R = TypeVar("R", bound=Any)

LEASE_LOST_MESSAGE = "This request's slot was reclaimed by the shared admission ledger; retry."


async def unless_lost(call: Awaitable[T], lease: SlotLease) -> T:
    """Run `call`, aborting it if the slot lease is lost meanwhile.

    A process fenced by the shared ledger (its heartbeat lapsed, its slots were handed
    to others) must stop using them at once, or the cap would be exceeded silently. A
    lease that can never be lost (one process's gate) is not watched: `call` runs in the
    caller's task (about 93k instructions less per request than a task pair and a wait).
    """
    if not lease.losable:
        return await call
    lost = lease.lost
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
        raise AdmissionUnavailable(1, LEASE_LOST_MESSAGE)
    return work.result()


def to_replica(lease: SlotLease, record: RequestRecord | None) -> dict[str, str]:
    """The upstream call's `replica=` argument: the replica the admission bound the request to
    (`[endpoints]`), noted on the record as its `endpoint` (host:port); {} without replicas,
    so the call is exactly today's."""
    replica: str | None = getattr(lease, "replica", None)  # a gate without [endpoints] binds none
    if replica is None:
        return {}
    if record is not None:
        record.endpoint = endpoint_of(replica)
    return {"replica": replica}


def route(router: ModelRouter, request: R, record: RequestRecord | None) -> tuple[str, R]:
    """The upstream, and the request as that upstream is called: a model alias becomes the
    upstream's own model name (the dialect still answers with the name the client used)."""
    upstream, model = router.resolve(request.model)
    if record is not None:
        record.upstream, record.upstream_model = upstream, model
        record.model = request.model
    if model != request.model:
        request = msgspec.structs.replace(request, model=model)
    return upstream, request


def salted(request: R, consumer: Consumer) -> R:
    """The request with its consumer's prefix-cache salt (`domain.cache_salt`): set by the
    gateway for every request of a known consumer, never taken from a client."""
    if consumer.cache_salt is None or request.cache_salt == consumer.cache_salt:
        return request
    return msgspec.structs.replace(request, cache_salt=consumer.cache_salt)


class Slots:
    """Admission through one gate, with its span and the record's queue wait."""

    __slots__ = ("_clock", "_gate", "_tracer", "_update_interval")

    def __init__(self, gate: AdmissionGate, clock: Clock, tracer: Tracer | None = None,
                 queue_update_interval: float = 1.0) -> None:
        self._gate = gate
        self._clock = clock
        self._tracer = tracer or NullTracer()
        self._update_interval = queue_update_interval

    def start(self) -> tuple[Span, float]:
        return self._tracer.start("gateway.admission"), self._clock.now()

    async def enter(self, upstream: str, span: Span, consumer: Consumer, slots: int = 1,
                    prefer: Sequence[str] = (), max_extra: int = 0) -> SlotLease | QueueTicket:
        """`slots`: the request's sequences (`domain.sequences`), taken together or not at all;
        `prefer`, `max_extra`: KV-cache affinity (`application.affinity`), for a replica."""
        span.set("gateway.upstream", upstream)
        if slots != 1:
            span.set("gateway.sequences", slots)
        try:
            return await self._gate.enter(upstream, consumer, slots, prefer, max_extra)
        except GatewayError as error:
            span.set("gateway.admission.outcome", error.kind)
            span.end(error.kind)
            raise

    def admitted(
        self, span: Span, started: float, record: RequestRecord | None,
        error: BaseException | None, outcome: str = "abandoned",
    ) -> float:
        """Close the admission span and note the queue wait, however admission ended; the
        instant it ended (for a granted lease: when its slot time starts, see `release`)."""
        now = self._clock.now()
        waited = now - started
        if record is not None:
            record.queue_wait_seconds = waited
        if isinstance(error, GatewayError):
            outcome = error.kind
        span.set("gateway.admission.outcome", outcome)
        span.set("gateway.queue.wait_seconds", waited)
        span.end(None if error is None or outcome == "abandoned" else outcome)
        return now

    def release(self, lease: SlotLease, record: RequestRecord | None, since: float) -> Awaitable[None]:
        """Give the lease's slots back (idempotent, as `SlotLease.release`), noting on the record
        how long they were held since `since` (the instant `admitted` returned), times how many:
        the request's slot-seconds (`gateway_consumer_slot_seconds_total`), however it ended.
        `lease.release()`'s own coroutine, to await: no coroutine of its own per request."""
        if record is not None:
            record.slot_seconds = (self._clock.now() - since) * lease.slots
        return lease.release()

    async def admit_quietly(self, upstream: str, record: RequestRecord | None, consumer: Consumer,
                            slots: int = 1, prefer: Sequence[str] = (),
                            max_extra: int = 0) -> tuple[SlotLease, float]:
        """`slots` slots, waiting in the queue if need be (nothing is reported while waiting),
        and the instant they were granted (for `release`)."""
        span, started = self.start()
        entry = await self.enter(upstream, span, consumer, slots, prefer, max_extra)
        if not entry.queued:
            return entry, self.admitted(span, started, record, None, "admitted")  # type: ignore[return-value]
        ticket: QueueTicket = entry  # type: ignore[assignment]
        span.set("gateway.queue.position_on_arrival", ticket.position())
        lease = await self.wait(ticket, span, started, record)
        return lease, self.admitted(span, started, record, None, "queued")

    async def wait(self, ticket: QueueTicket, span: Span, started: float, record: RequestRecord | None) -> SlotLease:
        try:
            while True:
                lease = await ticket.wait(3600.0)
                if lease is not None:
                    return lease
        except BaseException as error:
            await ticket.cancel()
            self.admitted(span, started, record, error)
            raise

    async def positions(
        self, upstream: str, ticket: QueueTicket, heartbeat: float | None = None
    ) -> AsyncIterator[QueuePosition | SlotLease | None]:
        """The position at once, then at most one update per interval, then the lease; with
        `heartbeat`, None at the first check after that many seconds without an update (the
        caller's cue for a keep-alive while the position stands still).

        A waiter reads its own position from the ledger (O(log n)) when its own timer
        fires; nothing is pushed to waiters when others leave the queue, so draining a
        queue of n waiters costs at most n frames per interval, not O(n^2) frames.
        The caller cancels the ticket if this generator is abandoned.
        """
        clock = self._clock
        last = ticket.position()
        yield QueuePosition(position=last, queued=self._gate.snapshot(upstream).queued)
        said = clock.now()
        while True:
            lease = await ticket.wait(self._update_interval)
            if lease is not None:
                yield lease
                return
            position = ticket.position()
            if position != last:
                last = position
                yield QueuePosition(position=position, queued=self._gate.snapshot(upstream).queued)
                said = clock.now()
            elif heartbeat is not None and clock.now() - said >= heartbeat:
                yield None
                said = clock.now()
