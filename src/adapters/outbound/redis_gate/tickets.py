"""The local half of a Redis ledger queue entry: `RedisTicket`.

Redis is the source of truth; a ticket only remembers what this process learnt and holds
the asyncio future a waiter sleeps on. Its life ends exactly once, locally, through
`_grant` (it becomes a `leases.RedisLease`) or `_end`, whichever of the pub/sub listener,
the waiter's own poll, its deadline, `drain` or fencing gets there first.
"""

from __future__ import annotations

import asyncio
import logging

from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN
from adapters.outbound.redis_gate.leases import RedisLease, new_lease
from adapters.outbound.redis_gate.ledger import LedgerCore
from adapters.outbound.redis_gate.upstream import Upstream
from domain.errors import AdmissionUnavailable, Draining, QueueTimeout

log = logging.getLogger("gateway.admission.redis")

# how a ticket's life ended (it ends exactly once)
WAITING, GRANTED, EXPIRED, DRAINED, CANCELLED, LOST = range(6)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class RedisTicket:
    """A place in an upstream's shared FIFO queue.

    `position()` is O(1): the position read from Redis by the last `wait` round (one
    ZRANK inside the poll script), so a queue frame never costs a round trip of its own.
    """

    __slots__ = (
        "_fut", "_gate", "_handed", "_lease", "_position", "_retry", "_state", "deadline",
        "owner", "slots", "token", "up",
    )
    queued = True

    def __init__(
        self, gate: LedgerCore, up: Upstream, token: str, owner: str,
        deadline: float, position: int, slots: int = 1,
    ) -> None:
        self._gate, self.up, self.token, self.owner = gate, up, token, owner
        self.slots = slots
        self.deadline = deadline  # on the gate's clock
        self._position = position
        self._state = WAITING
        self._fut: asyncio.Future[None] | None = None
        self._lease: RedisLease | None = None
        self._handed = False  # the lease was returned to the caller: it is theirs now
        self._retry = 1

    def position(self) -> int:
        """1-based place in the queue as last read (1 = next); 0 once it has left."""
        return self._position if self._state == WAITING else 0

    async def wait(self, timeout: float) -> RedisLease | None:
        """One or more rounds of: sleep until woken or `recheck` passes, then poll once.

        A pub/sub message naming this ticket ends the sleep with the grant itself; the
        poll round covers a lost message, so a grant is seen within `recheck` seconds
        plus one round trip at worst. Redis calls run in their own tasks: a hang-up
        cancels only our wait for them, never redis-py mid-command (which can corrupt a
        pooled connection or, on Python 3.11, swallow the cancellation).
        """
        gate = self._gate
        clock = gate._clock
        end = clock.now() + max(0.0, timeout)
        try:
            while True:
                lease = self._settle()
                if lease is not None:
                    return lease
                now = clock.now()
                if now >= self.deadline:
                    await gate._detached(self._expire())
                    continue
                wake = min(end, self.deadline, now + gate._recheck)
                if wake > now:
                    await self._sleep(wake - now)
                    if self._state != WAITING or clock.now() >= self.deadline:
                        continue
                await gate._detached(self._poll())
                if clock.now() >= end:
                    return self._settle()
        except asyncio.CancelledError:  # hang-up: leave, give back a slot granted meanwhile
            await self._abandon()
            raise

    async def cancel(self) -> None:
        """Leave the queue (idempotent); a slot granted meanwhile is given back."""
        await self._abandon()

    # -- transitions, driven by the gate -----------------------------------------------

    def _grant(self, replica: str | None) -> None:
        if self._state == WAITING:
            self._state = GRANTED
            self._lease = new_lease(self._gate, self.up, self.token, self.owner, self.slots, replica)
            self._gate._tickets.pop(self.token, None)
            self._nudge()

    def _lose(self) -> None:
        self._end(LOST)

    def _drain(self) -> None:
        self._end(DRAINED)

    def _end(self, state: int, retry_after: int = 1) -> None:
        if self._state == WAITING:
            self._state, self._retry = state, retry_after
            self._gate._tickets.pop(self.token, None)
            self._nudge()

    def _nudge(self) -> None:
        fut = self._fut
        if fut is not None:
            _wake(fut)

    # -- the Redis side ----------------------------------------------------------------

    async def _poll(self) -> None:
        """One wait round: maintenance plus one ZRANK, in one script call."""
        gate, up = self._gate, self.up
        try:
            code, value, replica = await gate._call(up, "poll", self.owner, self.token)
        except REDIS_DOWN as error:
            up.counts["unavailable"] += 1
            gate._pending[self.token] = (up, self.owner)
            self._end(LOST)
            log.warning("redis admission: waiter on %s lost Redis: %s", up.key, error)
            return
        if self._state != WAITING:
            return
        if code == scripts.ADMITTED:
            self._grant(replica)
        elif code == scripts.QUEUED:
            self._position = value
        elif code == scripts.FENCED:
            gate._fence("a waiter found this process's lease expired", self.owner)
            self._end(LOST)
        else:  # gone without a grant: the server's copy of the deadline passed first
            late = gate._clock.now() >= self.deadline - 1.0
            up.counts["timed_out" if late else "lost"] += 1
            self._end(EXPIRED if late else LOST, up.retry_after(up.cache[1]))

    async def _expire(self) -> None:
        """The queue deadline: leave the queue, unless slots were granted just before."""
        gate, up = self._gate, self.up
        try:
            code, _, replica = await gate._call(up, "cancel", self.owner, self.token, "timeout")
        except REDIS_DOWN:
            code, replica = scripts.REJECTED, None  # the server expires the entry at its own deadline
            gate._pending[self.token] = (up, self.owner)
        if self._state != WAITING:
            return
        if code == scripts.HOLDS:
            self._grant(replica)
        else:
            up.counts["timed_out"] += 1
            self._end(EXPIRED, up.retry_after(up.cache[1]))

    # -- internals ---------------------------------------------------------------------

    def _settle(self) -> RedisLease | None:
        """The lease once granted, None while queued; raises once the ticket has ended."""
        state = self._state
        if state == WAITING:
            return None
        if state == GRANTED:
            lease = self._lease
            if lease is not None and lease.lost.is_set():  # fenced before it was handed out
                self._state = LOST
                raise AdmissionUnavailable(1)
            self._handed = True
            return lease
        if state == EXPIRED:
            raise QueueTimeout(self._retry)
        if state == DRAINED:
            raise Draining(1)
        if state == LOST:
            raise AdmissionUnavailable(1)
        raise asyncio.CancelledError("queue ticket was cancelled")

    async def _sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut = self._fut = loop.create_future()
        timer = loop.call_later(seconds, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._fut = None

    async def _abandon(self) -> None:
        state = self._state
        if state == WAITING:
            self._end(CANCELLED)
            await self._gate._forget(self.up, self.token, self.owner, abandoned=True)
        elif state == GRANTED and not self._handed and self._lease is not None:
            self._state = CANCELLED  # granted in the same instant: give the slot back
            await self._lease.release()
