"""The local halves of the Redis ledger's granted slots: `RedisLease` (slots held in Redis)
and `OpenLease` (an uncapped upstream's local count, Redis never involved).

Redis is the source of truth; a lease only remembers what this process learnt (its token,
owner, slots and replica) and gives the slots back exactly once.
"""

from __future__ import annotations

import asyncio
import logging

from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN
from adapters.outbound.redis_gate.ledger import LedgerCore
from adapters.outbound.redis_gate.upstream import Upstream
from domain.admission.retry_after import EWMA_ALPHA
from domain.errors import AdmissionUnavailable

log = logging.getLogger("gateway.admission.redis")


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
