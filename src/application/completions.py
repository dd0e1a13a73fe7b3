"""Text completions and embeddings: route -> admit -> call upstream -> release, as for chat.

The same gate of the request's upstream admits them (one cap, one queue for every path
and surface), a consumer's limits apply and are charged from the upstream's usage (or an
estimate), hang-ups arrive as cancellation and every `finally` gives the slot back and
aborts the upstream call, and a lease lost to the shared ledger aborts the call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping

import msgspec

from application.affinity import NO_WISH, Affinity
from application.collected import completion_of
from application.consumer_limits import ConsumerLimits
from application.replica_care import ReplicaCare
from application.resume import Resumes
from application.service_charge import ServiceCharges
from application.slots import LEASE_LOST_MESSAGE, Slots, route, salted
from domain.canonical import ChunkBatch, StreamChunk, TextPart, UsageReport
from domain.completions import Completion, CompletionRequest, EmbeddingRequest, Embeddings
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import AdmissionUnavailable
from domain.records import RequestRecord
from domain.routing import ModelRouter
from domain.sequences import sequences
from ports.admission import AdmissionGate
from ports.clock import Clock
from ports.telemetry import Tracer
from ports.upstream import CompletionClient, EmbeddingClient


class CompletionService:
    """Serves text completions (plain and streamed)."""

    __slots__ = ("_affinity", "_care", "_charges", "_consumers", "_resumes", "_router", "_slots", "_upstreams")

    def __init__(self, router: ModelRouter, upstreams: Mapping[str, CompletionClient], gate: AdmissionGate,
                 clock: Clock, tracer: Tracer | None = None, consumers: ConsumerLimits | None = None,
                 affinity: Affinity | None = None, care: ReplicaCare | None = None,
                 resumes: Resumes | None = None) -> None:
        self._router = router
        self._affinity = affinity or Affinity()
        self._upstreams = upstreams
        self._slots = Slots(gate, clock, tracer)
        self._charges = ServiceCharges(gate, clock)  # token service, on `fairness = "tokens"` upstreams
        self._consumers = consumers or ConsumerLimits()
        self._care = care or ReplicaCare(gate, clock)  # without it: the safe retry, no ejection
        self._resumes = resumes or Resumes()  # without it: no upstream resumes a broken stream

    async def complete(self, request: CompletionRequest, record: RequestRecord | None = None,
                       consumer: Consumer = ANONYMOUS) -> Completion:
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
                answer = await self._resumes.answer(
                    self._care, upstream, request, lease, record, functools.partial(client.complete_text, request),
                    functools.partial(client.open_text_stream, request), client, completion_of,
                    functools.partial(affinity.granted, upstream, wish, lease) if wish.chain else None,
                )  # fmt: skip
                if answer.usage.input_tokens or answer.usage.output_tokens:
                    turn.meter.reported = answer.usage
                else:  # an upstream that reports no usage: charged (and reported) by estimate, never 0
                    turn.meter.feed_answer([TextPart(text=answer.text)])
                    answer = msgspec.structs.replace(answer, usage=turn.used())
            finally:
                if charged is not None:  # before the release: the next dispatch sees it
                    charged.settle()
                await self._slots.release(lease, record, since)
            return answer

    async def stream(self, request: CompletionRequest, record: RequestRecord | None = None,
                     consumer: Consumer = ANONYMOUS) -> AsyncIterator[ChunkBatch]:
        """The answer's chunk batches; failures before the first are raised (no byte was sent).
        An upstream that reports no usage gets an estimated `UsageReport` as the last batch."""
        upstream, request = route(self._router, salted(request, consumer), record)
        affinity = self._affinity
        async with self._consumers.turn(consumer, request, record) as turn:
            # Not awaited at all for an upstream without affinity (no [endpoints], or affinity off).
            wish = await affinity.wish(upstream, request, consumer) if affinity.wanted(upstream) else NO_WISH
            lease, since = await self._slots.admit_quietly(upstream, record, consumer, sequences(request),
                                                           wish.prefer, wish.max_extra)
            charged = self._charges.meter(turn.meter, request, upstream, consumer)  # None: not metered
            if charged is not None:
                turn.meter = charged
            lost, meter = lease.lost if lease.losable else None, turn.meter  # see ChatService.stream
            turn.reached_upstream = True
            try:
                client = self._upstreams[upstream]
                opener = functools.partial(client.open_text_stream, request)
                opened = functools.partial(affinity.granted, upstream, wish, lease) if wish.chain else None
                async with self._resumes.open(self._care, upstream, request, lease, record, opener,
                                              client, opened) as batches:  # fmt: skip
                    async for batch in batches:
                        if lost is not None and lost.is_set():
                            raise AdmissionUnavailable(1, LEASE_LOST_MESSAGE)
                        meter.feed_batch(batch)
                        yield batch
            finally:
                if charged is not None:  # before the release: the next dispatch sees it
                    charged.settle()
                await self._slots.release(lease, record, since)
            if meter.reported is None:
                yield [StreamChunk(events=[UsageReport(usage=meter.usage())])]


class EmbeddingService:
    """Serves embeddings; the inputs' tokens count for the consumer's limits."""

    __slots__ = ("_care", "_charges", "_consumers", "_router", "_slots", "_upstreams")

    def __init__(self, router: ModelRouter, upstreams: Mapping[str, EmbeddingClient], gate: AdmissionGate,
                 clock: Clock, tracer: Tracer | None = None, consumers: ConsumerLimits | None = None,
                 care: ReplicaCare | None = None) -> None:
        self._router = router
        self._upstreams = upstreams
        self._slots = Slots(gate, clock, tracer)
        self._charges = ServiceCharges(gate, clock)  # token service, on `fairness = "tokens"` upstreams
        self._consumers = consumers or ConsumerLimits()
        self._care = care or ReplicaCare(gate, clock)  # without it: the safe retry, no ejection

    async def embed(self, request: EmbeddingRequest, record: RequestRecord | None = None,
                    consumer: Consumer = ANONYMOUS) -> Embeddings:
        upstream, request = route(self._router, salted(request, consumer), record)
        async with self._consumers.turn(consumer, request, record) as turn:
            lease, since = await self._slots.admit_quietly(upstream, record, consumer, sequences(request))
            turn.reached_upstream = True
            charged = self._charges.meter(turn.meter, request, upstream, consumer)  # None: not metered
            if charged is not None:
                turn.meter = charged
            try:
                call = functools.partial(self._upstreams[upstream].embed, request)
                answer = await self._care.call(upstream, lease, record, call)
                if answer.usage.input_tokens:
                    turn.meter.reported = answer.usage
                else:
                    answer = msgspec.structs.replace(answer, usage=turn.used())
            finally:
                if charged is not None:  # before the release: the next dispatch sees it
                    charged.settle()
                await self._slots.release(lease, record, since)
            return answer
