"""The local halves of Redis ledger entries: leases (slots) and queue tickets.

Redis is the source of truth; these objects only remember what this process learnt and
hold the asyncio future a waiter sleeps on. A ticket's life ends exactly once, locally,
through `_grant` or `_end`, whichever of the pub/sub listener, the waiter's own poll,
its deadline, `drain` or fencing gets there first.
"""

from __future__ import annotations

import asyncio
import logging

from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN
from adapters.outbound.redis_gate.ledger import LedgerCore, Upstream
from domain.admission.retry_after import EWMA_ALPHA
from domain.errors import AdmissionUnavailable, Draining, QueueTimeout

log = logging.getLogger("gateway.admission.redis")

# how a ticket's life ended (it ends exactly once)
WAITING, GRANTED, EXPIRED, DRAINED, CANCELLED, LOST = range(6)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def new_lease(
    gate: LedgerCore, up: Upstream, token: str, owner: str, slots: int = 1, replica: str | None = None,
) -> RedisLease:
    """A lease for slots just granted in Redis (counted, and held until released)."""
    up.counts["admitted"] += 1
    lease = RedisLease(gate, up, token, owner, gate._clock.now(), slots, replica)
    gate._held.add(lease)
    return lease


class RedisLease:
    """Granted slots (`slots` of them, on `replica` with replicas); `release` gives back
    all of them, is idempotent, never raises, and is safe in `finally`.

    `lost` is set when this process learns it was fenced (its heartbeat lease expired and
    the slot may already belong to another process): work running on the slot should
    stop, because the cap no longer accounts for it (`ports.admission.SlotLease.lost`).
    """

    __slots__ = ("_gate", "_released", "granted_at", "lost", "owner", "replica", "slots", "token", "up")
    queued = False
    losable = True  # fencing hands a lapsed process's slots to others

    def __init__(
        self, gate: LedgerCore, up: Upstream, token: str, owner: str, now: float,
        slots: int = 1, replica: str | None = None,
    ) -> None:
        self._gate, self.up, self.token, self.owner = gate, up, token, owner
        self.slots, self.replica = slots, replica
        self.granted_at = now
        self._released = False
        self.lost = asyncio.Event()

    async def release(self) -> None:
        """Free the slots; a Redis failure is logged and retried by the heartbeat, never raised."""
        if self._released:
            return
        self._released = True
        gate, up = self._gate, self.up
        gate._held.discard(self)
        took = max(0.0, gate._clock.now() - self.granted_at)
        up.service = took if up.service is None else up.service + EWMA_ALPHA * (took - up.service)
        gate._check_idle()
        if self.lost.is_set():
            return  # fenced: the slots were reclaimed, the old owner is purged as a whole

        async def run() -> None:
            try:
                await gate._call(up, "release", self.owner, self.token)
            except REDIS_DOWN as error:
                gate._pending[self.token] = (up, self.owner)
                log.warning("redis admission: release on %s deferred: %s", up.key, error)

        await gate._detached(run())

    async def move(self) -> str | None:
        """The one safe retry (`ports.admission.SlotLease.move`): the `move` script moves the
        slots to another eligible replica with room in one step and promotes after. None,
        and nothing changes, when no other has room, without replicas, once released or lost.
        `AdmissionUnavailable` when Redis cannot be reached: if the script did run (a lost
        reply), the token is bound to the new replica and `release` frees that one anyway
        (release reads the binding in Redis); a second call answers the replica it is on."""
        source = self.replica
        if self._released or source is None or self.lost.is_set():
            return None
        gate, up, owner = self._gate, self.up, self.owner
        # its own task: a hang-up cancels only our wait for it, never redis-py mid-command
        call = asyncio.ensure_future(gate._call(up, "move", owner, self.token, source))
        call.add_done_callback(self._moved)
        try:
            code, _, target = await asyncio.shield(call)
        except REDIS_DOWN as error:
            up.counts["unavailable"] += 1
            log.warning("redis admission: move on %s failed: %s", up.key, error)
            raise AdmissionUnavailable(1) from error
        if code == scripts.FENCED:
            gate._fence("a move found this process's lease expired", owner)
            return None
        if code != scripts.ADMITTED or target is None or self._released or self.lost.is_set():
            return None
        self.replica = target  # (`_moved` has set it already; said again for the reader)
        return target

    def _moved(self, call: asyncio.Future[tuple[int, int, str | None]]) -> None:
        """The move's reply, even when the caller stopped waiting for it: `replica` follows."""
        if call.cancelled() or call.exception() is not None:
            return
        code, _, target = call.result()
        if code == scripts.ADMITTED and target is not None:
            self.replica = target


class OpenLease:
    """A lease on an uncapped upstream: a local count only, Redis is never involved."""

    __slots__ = ("_gate", "_released", "lost", "replica", "slots", "up")
    queued = False
    losable = False

    def __init__(self, gate: LedgerCore, up: Upstream, slots: int = 1) -> None:
        self._gate, self.up, self._released = gate, up, False
        self.slots, self.replica = slots, None
        self.lost = asyncio.Event()  # never set: nothing shared can be lost

    async def release(self) -> None:
        if not self._released:
            self._released = True
            self.up.open -= self.slots
            self._gate._check_idle()

    async def move(self) -> None:
        """No replicas on an uncapped upstream: nothing to move to."""
        return None


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
