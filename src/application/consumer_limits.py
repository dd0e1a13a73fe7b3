"""A consumer's limits around one request: the cheap ones at the door, tokens once decoded.

Order, for every dialect (the edge runs the first steps before the body is read, so a
refusal costs no body and no decode):
1. authentication (the edge guard);
2. `admit`: one request of the consumer's `requests_per_minute` (`RateLimited`, 429),
   then one of its `max_in_flight` slots, waited for like a queue place (beyond
   `max_waiting` waiters a 429, at the wait's end a 503 `queue-timeout`); the returned
   `Door` holds the slot until the request ends, stream included;
3. the body is read and decoded (4xx), the model routed;
4. `turn`: the request's token estimate is reserved in every token limit (429, taking no
   queue place and no slot), then the request enters its upstream's admission gate. At
   the end the reservation is replaced by what was used: the upstream's usage, or the
   `UsageMeter` estimate for an upstream that reports none, or for a request cut short by
   a hang-up or an upstream error (what was produced; nothing when it never reached the
   upstream).
"""

from __future__ import annotations

from types import TracebackType

from domain.canonical import Usage
from domain.consumers import ANONYMOUS, EMPTY_SNAPSHOT, Consumer
from domain.errors import RateLimited, UpstreamUnavailable
from domain.records import RequestRecord
from domain.usage_estimate import Estimable, UsageMeter, reservation_tokens
from ports.consumers import ConsumerConcurrency, ConsumerSlot, Reservation, UsageLedger

DEFAULT_WAIT_SECONDS = 30.0  # a consumer slot's wait when no upstream has a queue timeout
DEFAULT_MAX_WAITING = 64  # `[auth] max_waiting_per_consumer`


class Door:
    """What a request took at the door: its consumer slot, if any; `release` is idempotent."""

    __slots__ = ("_slot",)

    def __init__(self, slot: ConsumerSlot | None = None) -> None:
        self._slot = slot

    async def release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            await slot.release()


OPEN_DOOR = Door()  # nothing taken: anonymous, unlimited, or no slot needed


class Turn:
    """One request's share of its consumer's token limits, while it runs (`async with`).

    This one reserves nothing: the anonymous consumer, or one without token limits. A plain
    object rather than an `asynccontextmanager`: that costs a generator and its wrapper per
    request, for nothing to do (`_ReservedTurn` is the one with work around the block).
    """

    __slots__ = ("meter", "reached_upstream", "reservation")

    def __init__(self, request: Estimable) -> None:
        self.meter = UsageMeter(request)
        self.reached_upstream = False
        self.reservation: Reservation | None = None

    def used(self) -> Usage:
        return self.meter.usage()

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class _ReservedTurn(Turn):
    """A turn of a token-limited consumer: reserved on entry, settled with what was used on exit."""

    __slots__ = ("_consumer", "_record", "_request", "_usage")

    def __init__(
        self, usage: UsageLedger, consumer: Consumer, request: Estimable, record: RequestRecord | None
    ) -> None:
        self.meter = UsageMeter(request)  # Turn.__init__, written out
        self.reached_upstream = False
        self.reservation: Reservation | None = None
        self._usage = usage
        self._consumer = consumer
        self._request = request
        self._record = record

    async def __aenter__(self) -> Turn:
        try:
            # the prompt's estimate the meter already holds: counted once per request
            tokens = reservation_tokens(self._request, self.meter.prompt)
            reservation = await self._usage.reserve_tokens(self._consumer, tokens)
        except RateLimited as refused:
            _note_refusal(self._record, refused)
            raise
        self.reservation = reservation
        if self._record is not None:
            self._record.rate = reservation.snapshot
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and issubclass(exc_type, UpstreamUnavailable):
            self.reached_upstream = False  # refused or unreachable: the prompt never got there
        assert self.reservation is not None
        await self.reservation.settle(self.meter.total if self.reached_upstream else 0)


def _note_refusal(record: RequestRecord | None, refused: RateLimited) -> None:
    if record is not None:
        record.rate, record.rate_limit = refused.snapshot, refused.limit.value


class ConsumerLimits:
    """Applies consumer limits; with no ledger (or the anonymous consumer) it costs nothing."""

    __slots__ = ("_concurrency", "_max_waiting", "_usage", "_wait")

    def __init__(
        self,
        usage: UsageLedger | None = None,
        concurrency: ConsumerConcurrency | None = None,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        max_waiting: int = DEFAULT_MAX_WAITING,
    ) -> None:
        self._usage = usage
        self._concurrency = concurrency
        self._wait = wait_seconds
        self._max_waiting = max_waiting

    async def admit(self, consumer: Consumer, record: RequestRecord | None = None) -> Door:
        """Steps 2 (module doc): the request count, then the consumer slot; raises `RateLimited`
        (429) or `QueueTimeout` (503). Nothing here needs the request's body."""
        if consumer is ANONYMOUS:
            return OPEN_DOOR
        limits = consumer.limits  # `limits.unlimited`, written out: a property calling a property
        if (limits.requests_per_minute is None and limits.tokens_per_minute is None and limits.tokens_per_day is None
                and limits.max_in_flight is None):
            return OPEN_DOOR
        snapshot = EMPTY_SNAPSHOT
        if self._usage is not None:
            try:
                snapshot = await self._usage.take_request(consumer)
            except RateLimited as refused:
                _note_refusal(record, refused)
                raise
            if record is not None and snapshot is not EMPTY_SNAPSHOT:
                record.rate = snapshot
        if limits.max_in_flight is None or self._concurrency is None:
            return OPEN_DOOR
        try:
            slot = await self._concurrency.acquire(consumer, self._wait, self._max_waiting)
        except RateLimited as refused:  # its own concurrency is exhausted, not the pool
            busy = RateLimited(refused.limit, refused.retry_after or 1, snapshot, refused.message)
            _note_refusal(record, busy)
            raise busy from None
        return Door(slot)

    def turn(self, consumer: Consumer, request: Estimable, record: RequestRecord | None) -> Turn:
        """Step 4 (module doc): the token reservation around the request's upstream call
        (`async with`); a refusal (`RateLimited`, 429) is raised on entering it."""
        if consumer is ANONYMOUS or self._usage is None:
            return Turn(request)
        limits = consumer.limits
        if limits.tokens_per_minute is None and limits.tokens_per_day is None:  # `not limits.token_limited`
            return Turn(request)
        return _ReservedTurn(self._usage, consumer, request, record)
