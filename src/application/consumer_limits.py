"""A consumer's limits around one request: reserve (or 429), take a consumer slot, settle.

Order, for every dialect: authentication happened at the edge; here the request first
reserves one request and its token estimate (`RateLimited`, 429, never takes a queue
place or a slot), then takes one of its consumer's `max_in_flight` slots (waiting, like
a queued request, not refused), and only then enters its upstream's admission gate. At
the end the reservation is replaced by what was used: the upstream's usage, or the
`UsageMeter` estimate for an upstream that reports none, or for a request cut short by
a hang-up or an upstream error (what was produced; nothing when it never reached the
upstream).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from domain.canonical import Usage
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import RateLimited, UpstreamUnavailable
from domain.records import RequestRecord
from domain.usage_estimate import Estimable, UsageMeter, prompt_tokens, reservation_tokens
from ports.consumers import ConsumerConcurrency, ConsumerSlot, Reservation, UsageLedger

DEFAULT_WAIT_SECONDS = 30.0  # a consumer slot's wait on an upstream without a queue timeout


class Turn:
    """One request's share of its consumer's limits, while it runs."""

    __slots__ = ("meter", "reached_upstream", "reservation")

    def __init__(self, request: Estimable) -> None:
        self.meter = UsageMeter(prompt_tokens(request))
        self.reached_upstream = False
        self.reservation: Reservation | None = None

    def used(self) -> Usage:
        return self.meter.usage()


class ConsumerLimits:
    """Applies consumer limits; with no ledger (or the anonymous consumer) it costs nothing."""

    __slots__ = ("_concurrency", "_usage", "_waits")

    def __init__(
        self,
        usage: UsageLedger | None = None,
        concurrency: ConsumerConcurrency | None = None,
        waits: Mapping[str, float] | None = None,
    ) -> None:
        self._usage = usage
        self._concurrency = concurrency
        self._waits = dict(waits or {})

    @asynccontextmanager
    async def turn(
        self, consumer: Consumer, request: Estimable, upstream: str, record: RequestRecord | None
    ) -> AsyncIterator[Turn]:
        turn = Turn(request)
        if consumer is ANONYMOUS or consumer.limits.unlimited or self._usage is None:
            yield turn
            return
        try:
            reservation = turn.reservation = await self._usage.reserve(consumer, reservation_tokens(request))
        except RateLimited as refused:
            if record is not None:
                record.rate, record.rate_limit = refused.snapshot, refused.limit.value
            raise
        if record is not None:
            record.rate = reservation.snapshot
        slot: ConsumerSlot | None = None
        try:
            if consumer.limits.max_in_flight is not None and self._concurrency is not None:
                wait = self._waits.get(upstream, DEFAULT_WAIT_SECONDS)
                slot = await self._concurrency.acquire(consumer, wait)
            yield turn
        except UpstreamUnavailable:
            turn.reached_upstream = False  # refused or unreachable: the prompt never got there
            raise
        finally:
            try:
                if slot is not None:
                    await slot.release()
            finally:
                await reservation.settle(turn.meter.total if turn.reached_upstream else 0)
