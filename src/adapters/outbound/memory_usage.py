"""Consumer counters for ONE process: the usage ledger and `max_in_flight` per consumer.

Like the in-memory admission gate, correct inside one process only: with several
processes each enforces its own limits (the Redis backend shares them). Consumers are
keyed by name, so a keys-file reload that changes a consumer's limits keeps its usage.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from domain.consumers import EMPTY_SNAPSHOT, Consumer, ConsumerLimits, LimitKind, RateSnapshot
from domain.errors import QueueTimeout, RateLimited
from domain.rate_limits import ConsumerUsage, Receipt, to_ms

_SWEEP_EVERY = 1024  # reservations between two sweeps of consumers whose counters are fresh again


class UnlimitedReservation:
    """The reservation of a consumer without request or token limits: touches nothing."""

    __slots__ = ()
    snapshot: RateSnapshot = EMPTY_SNAPSHOT

    async def settle(self, tokens_used: int) -> None:
        return None


UNLIMITED = UnlimitedReservation()


class _MemoryReservation:
    __slots__ = ("_ledger", "_limits", "_name", "_receipt", "_settled", "snapshot")

    def __init__(self, ledger: InMemoryUsageLedger, name: str, limits: ConsumerLimits,
                 receipt: Receipt) -> None:
        self._ledger, self._name, self._limits, self._receipt = ledger, name, limits, receipt
        self._settled = False
        self.snapshot = receipt.snapshot

    async def settle(self, tokens_used: int) -> None:
        if self._settled:
            return
        self._settled = True
        ledger, limits = self._ledger, self._limits
        entry = ledger._usage.get(self._name)
        if entry is None:  # swept meanwhile: fresh again
            usage = ConsumerUsage()
            usage.settle(limits, self._receipt, tokens_used, ledger._wall_time())
            ledger._usage[self._name] = (usage, limits)
        else:  # the state is changed in place: the table keeps it
            entry[0].settle(limits, self._receipt, tokens_used, ledger._wall_time())


class InMemoryUsageLedger:
    """`ports.consumers.UsageLedger` in this process (`domain.rate_limits` does the math).

    `wall_time` is wall-clock seconds (the UTC day needs the real date); tests pass their own.
    """

    __slots__ = ("_ops", "_usage", "_wall_time")

    def __init__(self, wall_time: Callable[[], float] = time.time) -> None:
        self._wall_time = wall_time
        self._usage: dict[str, tuple[ConsumerUsage, ConsumerLimits]] = {}
        self._ops = 0

    async def start(self) -> None:
        """Nothing to connect."""

    async def close(self) -> None:
        """Nothing to release."""

    async def take_request(self, consumer: Consumer) -> RateSnapshot:
        limits = consumer.limits
        if limits.requests_per_minute is None:
            return EMPTY_SNAPSHOT
        self._ops += 1  # now and then a sweep (every limited request: no helper call)
        if self._ops % _SWEEP_EVERY == 0:
            self._sweep()
        entry = self._usage.get(consumer.name)
        usage = ConsumerUsage() if entry is None else entry[0]
        snapshot = usage.take_request(limits, self._wall_time())  # RateLimited: nothing taken
        if entry is None or entry[1] is not limits:  # new, or its limits changed (a reload)
            self._usage[consumer.name] = (usage, limits)
        return snapshot

    async def reserve_tokens(self, consumer: Consumer, tokens: int) -> UnlimitedReservation | _MemoryReservation:
        limits = consumer.limits
        if limits.tokens_per_minute is None and limits.tokens_per_day is None:  # `not limits.token_limited`
            return UNLIMITED
        self._ops += 1  # now and then a sweep
        if self._ops % _SWEEP_EVERY == 0:
            self._sweep()
        entry = self._usage.get(consumer.name)
        usage = ConsumerUsage() if entry is None else entry[0]
        receipt = usage.reserve_tokens(limits, tokens, self._wall_time())  # RateLimited: nothing taken
        if entry is None or entry[1] is not limits:
            self._usage[consumer.name] = (usage, limits)
        return _MemoryReservation(self, consumer.name, limits, receipt)

    def _sweep(self) -> None:
        """Forget consumers whose counters are back to fresh (full buckets, nothing today)."""
        now_ms = to_ms(self._wall_time())
        for name, (usage, limits) in list(self._usage.items()):
            usage.advance(limits, now_ms)
            if usage.idle_ms(limits, now_ms) == 0:
                del self._usage[name]

    def tracked(self) -> int:
        """How many consumers have counters now (tests: idle consumers are forgotten)."""
        self._sweep()
        return len(self._usage)


def too_many_waiting(max_waiting: int) -> RateLimited:
    """The 429 of a consumer whose `max_in_flight` slots are taken and `max_waiting` requests wait."""
    return RateLimited(LimitKind.MAX_IN_FLIGHT, 1, message=(
        f"This consumer already has {max_waiting} requests waiting for one of its max_in_flight slots."))


class UnlimitedSlot:
    """The slot of a consumer without `max_in_flight`: nothing to give back."""

    __slots__ = ()

    async def release(self) -> None:
        return None


UNLIMITED_SLOT = UnlimitedSlot()


def _handed_over(fut: asyncio.Future[None]) -> bool:
    """A waiter's future has a result only when `_release` handed it a slot (a timeout or a
    cancellation cancels it instead)."""
    return fut.done() and not fut.cancelled()


class _Consumer:
    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = 0
        self.waiters: deque[asyncio.Future[None]] = deque()  # FIFO; a result = a slot handed over


class _MemorySlot:
    __slots__ = ("_name", "_owner", "_released")

    def __init__(self, owner: InMemoryConsumerConcurrency, name: str) -> None:
        self._owner, self._name, self._released = owner, name, False

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner._release(self._name)


class InMemoryConsumerConcurrency:
    """`ports.consumers.ConsumerConcurrency` in this process: FIFO waiters per consumer.

    A released slot is handed straight to the first waiter (its future gets a result), so
    a newcomer can never overtake a waiter; entries of idle consumers are removed.
    """

    __slots__ = ("_consumers",)

    def __init__(self) -> None:
        self._consumers: dict[str, _Consumer] = {}

    async def start(self) -> None:
        """Nothing to connect."""

    async def close(self) -> None:
        """Nothing to release."""

    async def acquire(self, consumer: Consumer, timeout: float, max_waiting: int) -> UnlimitedSlot | _MemorySlot:
        cap = consumer.limits.max_in_flight
        if cap is None:
            return UNLIMITED_SLOT
        name = consumer.name
        state = self._consumers.get(name)
        if state is None:
            state = self._consumers[name] = _Consumer()
        if state.held < cap and not state.waiters:
            state.held += 1
            return _MemorySlot(self, name)
        if len(state.waiters) >= max_waiting:
            self._forget_if_idle(name, state)
            raise too_many_waiting(max_waiting)
        if timeout <= 0:
            self._forget_if_idle(name, state)
            raise QueueTimeout(1)
        fut = asyncio.get_running_loop().create_future()
        state.waiters.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            if not _handed_over(fut):
                self._leave(name, state, fut)
                raise QueueTimeout(1) from None
            # handed over in the same instant the wait ran out: it is ours
        except asyncio.CancelledError:
            if _handed_over(fut):  # handed over as we were cancelled: pass it on
                self._release(name)
            else:
                self._leave(name, state, fut)
            raise
        return _MemorySlot(self, name)

    def in_flight(self, name: str) -> int:
        state = self._consumers.get(name)
        return 0 if state is None else state.held

    def waiting(self, name: str) -> int:
        state = self._consumers.get(name)
        return 0 if state is None else len(state.waiters)

    def _release(self, name: str) -> None:
        state = self._consumers[name]
        while state.waiters:
            fut = state.waiters.popleft()
            if not fut.done():  # a cancelled waiter's future is done: skip it
                fut.set_result(None)  # the slot goes on to the longest waiter: `held` unchanged
                return
        state.held -= 1
        self._forget_if_idle(name, state)

    def _leave(self, name: str, state: _Consumer, fut: asyncio.Future[None]) -> None:
        if fut in state.waiters:
            state.waiters.remove(fut)
        self._forget_if_idle(name, state)

    def _forget_if_idle(self, name: str, state: _Consumer) -> None:
        if state.held == 0 and not state.waiters:
            self._consumers.pop(name, None)
