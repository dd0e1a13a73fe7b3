"""What the in-process gate hands out: leases (granted slots) and queue tickets.

The upstream's `SlotLedger` is the truth; a ticket only remembers how its life ended
(exactly once: granted, expired, drained or cancelled) and holds the asyncio future its
waiter sleeps on.
"""

from __future__ import annotations

import asyncio

from adapters.outbound.memory_gate.ledgers import LedgerCore, Upstream
from domain.admission.decisions import Cancel
from domain.admission.ledger import SlotLedger
from domain.errors import Draining, QueueTimeout

# how a ticket's life ended (it ends exactly once)
_WAITING, _GRANTED, _EXPIRED, _DRAINED, _CANCELLED = range(5)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryLease:
    """Granted slots (`slots` of them, on `replica` if the upstream has replicas);
    `release` gives all of them back, is idempotent and safe in `finally`."""

    __slots__ = ("_gate", "_released", "_ticket", "_up", "lost", "replica", "slots")
    queued = False
    losable = False  # one process holds every slot it counts

    def __init__(
        self, gate: LedgerCore, up: Upstream, ticket: int, slots: int = 1, replica: str | None = None,
    ) -> None:
        self._gate, self._up, self._ticket, self._released = gate, up, ticket, False
        self.slots, self.replica = slots, replica
        self.lost = gate.never_lost  # one process holds every slot it counts: never lost

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self._gate._release(self._up, self._ticket, self.slots)

    async def move(self) -> str | None:
        if self._released or self.replica is None:
            return None
        target = self._gate._move(self._up, self._ticket)
        if target is not None:
            self.replica = target
        return target


class MemoryTicket:
    """A place in one upstream's queue."""

    __slots__ = ("_end", "_fut", "_gate", "_id", "_lease", "_ledger", "_retry", "_up", "deadline")
    queued = True

    def __init__(
        self,
        gate: LedgerCore,
        up: Upstream,
        ledger: SlotLedger,
        ticket: int,
        deadline: float,
    ) -> None:
        self._gate, self._up, self._ledger, self._id = gate, up, ledger, ticket
        self.deadline = deadline
        self._fut: asyncio.Future[None] | None = None
        self._end = _WAITING
        self._retry = 1
        self._lease: MemoryLease | None = None

    def position(self) -> int:
        """1-based place in the queue now (1 = next); 0 once it has left the queue."""
        return self._ledger.position(self._id)

    async def wait(self, timeout: float) -> MemoryLease | None:
        now = self._gate._clock.now()
        lease = self._settle(now)
        if lease is not None or timeout <= 0:
            return lease
        remaining = self.deadline - now
        at_deadline = remaining <= timeout
        loop = asyncio.get_running_loop()
        fut = self._fut = loop.create_future()
        timer = loop.call_later(remaining if at_deadline else timeout, _wake, fut)
        try:
            await fut
        except asyncio.CancelledError:  # hang-up: leave, give back a slot granted meanwhile
            self._abandon()
            raise
        finally:
            timer.cancel()
            self._fut = None
        now = self._gate._clock.now()
        if at_deadline:  # woken by our own deadline timer unless the state changed
            now = max(now, self.deadline)
        return self._settle(now)

    async def cancel(self) -> None:
        self._abandon()

    # -- called by the gate (`ledgers.Waiter`) -----------------------------------------

    def _nudge(self) -> None:
        fut = self._fut
        if fut is not None:
            _wake(fut)

    def _time_out(self, retry_after: int) -> None:
        self._retry = retry_after
        self._end_with(_EXPIRED)

    def _drain(self) -> None:
        self._end_with(_DRAINED)

    # -- internals ---------------------------------------------------------------------

    def _settle(self, now: float) -> MemoryLease | None:
        """The lease if granted, None while queued; raises if the ticket has ended."""
        if self._end == _WAITING:
            ledger = self._ledger
            if not ledger.holds(self._id):
                self._gate._expire(self._up, now)  # may end it, or admit it (a lapsed head)
            if self._end == _WAITING:
                if not ledger.holds(self._id):
                    return None
                self._end = _GRANTED
                slots, replica = ledger.binding(self._id)
                self._lease = MemoryLease(self._gate, self._up, self._id, slots, replica)
        end = self._end
        if end == _GRANTED:
            return self._lease
        if end == _EXPIRED:
            raise QueueTimeout(self._retry)
        if end == _DRAINED:
            raise Draining(1)
        raise asyncio.CancelledError("queue ticket was cancelled")

    def _end_with(self, end: int) -> None:
        self._end = end
        self._nudge()

    def _abandon(self) -> None:
        if self._end != _WAITING:
            return  # ended already, or the lease belongs to the caller now
        self._end_with(_CANCELLED)
        self._up.waiters.pop(self._id, None)
        if self._ledger.cancel(self._id, self._gate._clock.now()) is Cancel.HOLDS_SLOT:  # granted meanwhile
            self._gate._release(self._up, self._id)
        else:
            self._gate._wake_granted(self._up)  # a k-request that left the head lets others in
