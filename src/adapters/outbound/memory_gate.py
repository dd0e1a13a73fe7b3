"""In-process admission gate: one `SlotLedger` per capped upstream, on asyncio.

Correct in ONE process only (bootstrap refuses several workers with it). The ledger is
the single source of truth; an asyncio future per waiting call is only a wake-up, so a
grant, an expiry or a drain that lands while nobody waits is still seen by the next
`wait`. No background task: expiry is applied lazily on every enter, wait, release and
snapshot, and a waiter's own timer is armed for its queue deadline.

A ticket's owner must end it (`wait` -> lease, or `cancel`) on every path, e.g. in
`except BaseException`: a slot granted to a ticket nobody collects is never given back.

A request takes `slots` (k) of the cap at once, in its place in the queue (head-of-line:
see `domain.admission.ledger.SlotLedger`). An upstream listed in `replica_limits` has replicas
(`domain.replicas.ReplicaSet` inside its ledger): none is ready until `set_replicas`, and
every lease is bound to the replica picked with its slots (`lease.replica`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from adapters.outbound.idle_signal import IdleSignal
from domain.admission.decisions import Cancel, Outcome
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import Draining, QueueFull, QueueTimeout
from domain.replicas import Replica
from ports.admission import GateSnapshot
from ports.clock import Clock

# how a ticket's life ended (it ends exactly once)
_WAITING, _GRANTED, _EXPIRED, _DRAINED, _CANCELLED = range(5)
_COUNTER_NAMES = (
    "admitted",
    "queued",
    "rejected_full",
    "rejected_draining",
    "timed_out",
    "abandoned",
    "drained",
)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Upstream:
    __slots__ = ("admitted", "key", "ledger", "open", "waiters")

    def __init__(self, key: str, policy: AdmissionPolicy | None, replica_limit: int | None = None) -> None:
        self.key = key
        if policy is None and replica_limit is not None:
            raise ValueError(f"upstream {key!r} has replicas but no admission policy")
        self.ledger = None if policy is None else SlotLedger(policy, replica_limit=replica_limit)
        self.open = 0  # leases held on an uncapped upstream
        self.admitted = 0  # leases ever granted on an uncapped upstream
        self.waiters: dict[int, _Ticket] = {}  # queued ticket id -> ticket


class _Lease:
    """Granted slots (`slots` of them, on `replica` if the upstream has replicas);
    `release` gives all of them back, is idempotent and safe in `finally`."""

    __slots__ = ("_gate", "_released", "_ticket", "_up", "lost", "replica", "slots")
    queued = False
    losable = False  # one process holds every slot it counts

    def __init__(
        self, gate: InMemoryAdmissionGate, up: _Upstream, ticket: int, slots: int = 1, replica: str | None = None,
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


class _Ticket:
    """A place in one upstream's queue."""

    __slots__ = ("_end", "_fut", "_gate", "_id", "_lease", "_ledger", "_retry", "_up", "deadline")
    queued = True

    def __init__(
        self,
        gate: InMemoryAdmissionGate,
        up: _Upstream,
        ledger: SlotLedger,
        ticket: int,
        deadline: float,
    ) -> None:
        self._gate, self._up, self._ledger, self._id = gate, up, ledger, ticket
        self.deadline = deadline
        self._fut: asyncio.Future[None] | None = None
        self._end = _WAITING
        self._retry = 1
        self._lease: _Lease | None = None

    def position(self) -> int:
        """1-based place in the queue now (1 = next); 0 once it has left the queue."""
        return self._ledger.position(self._id)

    async def wait(self, timeout: float) -> _Lease | None:
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

    # -- internals ---------------------------------------------------------------------

    def _settle(self, now: float) -> _Lease | None:
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
                self._lease = _Lease(self._gate, self._up, self._id, slots, replica)
        end = self._end
        if end == _GRANTED:
            return self._lease
        if end == _EXPIRED:
            raise QueueTimeout(self._retry)
        if end == _DRAINED:
            raise Draining(1)
        raise asyncio.CancelledError("queue ticket was cancelled")

    def _nudge(self) -> None:
        fut = self._fut
        if fut is not None:
            _wake(fut)

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


class InMemoryAdmissionGate:
    """`ports.admission.AdmissionGate` for one process: cap, depth and order per upstream.

    `None` as an upstream's policy means uncapped: `enter` grants a lease at once.
    `replica_limits` (upstream key -> `[endpoints] max_in_flight`): the upstreams with
    replicas; each starts with none ready (requests queue) until `set_replicas`.
    """

    __slots__ = ("_clock", "_draining", "_idle", "_ups", "never_lost")

    def __init__(
        self, policies: Mapping[str, AdmissionPolicy | None], clock: Clock,
        replica_limits: Mapping[str, int] | None = None,
    ) -> None:
        limits = dict(replica_limits or {})
        unknown = sorted(set(limits) - set(policies))
        if unknown:
            raise ValueError(f"replica limits for unknown upstreams: {', '.join(unknown)}")
        self.never_lost = asyncio.Event()  # every lease's `lost`: nothing sets it
        self._clock = clock
        self._ups = {key: _Upstream(key, policy, limits.get(key)) for key, policy in policies.items()}
        self._draining = False
        self._idle = IdleSignal(self._is_idle)

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> _Lease | _Ticket:
        """A lease, or a queue ticket; KeyError for an upstream not configured.

        `consumer` places the ticket under `fairness = "fair"` and counts toward
        `max_queued_per_consumer`; `fifo` orders by arrival whoever it is. `slots` (k):
        the sequence slots the request takes; `TooManySequences` when k is above the cap
        (or one replica's limit): it could never be admitted. `prefer`/`max_extra`: affinity
        for a request admitted at once (`domain.replicas.pick`)."""
        up = self._ups[upstream]
        ledger = up.ledger
        if ledger is None:
            if self._draining:
                raise Draining(1)
            up.open += slots
            up.admitted += 1
            return _Lease(self, up, 0, slots)
        ledger.check(slots)
        now = self._clock.now()
        if ledger.queued:
            self._expire(up, now)
        decision = ledger.arrive(now, consumer, slots, prefer, max_extra)
        self._wake_granted(up)
        outcome = decision.outcome
        if outcome is Outcome.ADMITTED:
            _, replica = ledger.binding(decision.ticket)
            return _Lease(self, up, decision.ticket, slots, replica)
        if outcome is Outcome.QUEUED:
            ticket = _Ticket(self, up, ledger, decision.ticket, decision.deadline)
            up.waiters[decision.ticket] = ticket
            return ticket
        if outcome is Outcome.REJECTED:
            raise QueueFull(decision.retry_after)
        raise Draining(decision.retry_after)  # closed by `drain`; the ledger counted it

    async def start(self) -> None:
        """Nothing to connect: the ledger lives in this process."""

    async def close(self) -> None:
        """Nothing to release."""

    def snapshot(self, upstream: str) -> GateSnapshot:
        up = self._ups[upstream]
        ledger = up.ledger
        if ledger is None:
            return GateSnapshot(in_use=up.open, queued=0, limit=None, queue_limit=None)
        now = self._clock.now()
        self._expire(up, now)
        policy = ledger.policy
        queued = ledger.queued
        return GateSnapshot(
            in_use=ledger.in_flight,
            queued=queued,
            limit=policy.max_in_flight,
            queue_limit=policy.queue_depth,
            queued_by_priority=ledger.queued_by_priority() if queued else None,
            oldest_wait_seconds=ledger.oldest_wait(now) if queued else None,
        )

    def upstreams(self) -> list[str]:
        return list(self._ups)

    def set_replicas(self, upstream: str, ready: Iterable[str]) -> None:
        """The replicas discovery sees now: new ones take requests, missing ones drain;
        queued requests that fit now are admitted at once. KeyError for an upstream
        without replicas."""
        up = self._ups[upstream]
        ledger = up.ledger
        if ledger is None or ledger.replicas is None:
            raise KeyError(f"upstream {upstream!r} has no replicas")
        now = self._clock.now()
        self._expire(up, now)
        self._nudge_all(up, ledger.set_replicas(ready, now))

    def set_ejected(self, upstream: str, ejected: Iterable[str]) -> None:
        """The replicas ejected now: no new request, their slots leave the live cap; queued
        requests that fit when one returns are admitted at once."""
        up, ledger = self._replicated(upstream)
        self._nudge_all(up, ledger.set_ejected(ejected, self._clock.now()))

    def set_saturated(self, upstream: str, saturated: Iterable[str]) -> None:
        """The replicas whose own metrics say they are full: no new request for them."""
        up, ledger = self._replicated(upstream)
        self._nudge_all(up, ledger.set_saturated(saturated, self._clock.now()))

    def replicas(self, upstream: str) -> list[Replica]:
        """The upstream's replicas now (ready and draining); [] without replicas."""
        ledger = self._ups[upstream].ledger
        return [] if ledger is None else ledger.replica_view()

    def counters(self, upstream: str) -> dict[str, int]:
        """Cumulative outcomes: admitted, queued, rejected_full, rejected_draining,
        timed_out, abandoned (hung up while queued), drained (failed by `drain`)."""
        up = self._ups[upstream]
        if up.ledger is None:
            return {name: up.admitted if name == "admitted" else 0 for name in _COUNTER_NAMES}
        return up.ledger.counters()

    def drain(self) -> None:
        """Admit nothing more; fail every queued waiter with `Draining`.

        Leases already granted keep running and are released as usual.
        """
        self._draining = True
        now = self._clock.now()
        for up in self._ups.values():
            if up.ledger is not None:
                self._expire(up, now)
                for tid in up.ledger.close():
                    up.waiters.pop(tid)._end_with(_DRAINED)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no lease is held; False if `timeout` passes first."""
        return await self._idle.wait(timeout)

    # -- internals ---------------------------------------------------------------------

    def _replicated(self, upstream: str) -> tuple[_Upstream, SlotLedger]:
        up = self._ups[upstream]
        ledger = up.ledger
        if ledger is None or ledger.replicas is None:
            raise KeyError(f"upstream {upstream!r} has no replicas")
        self._expire(up, self._clock.now())
        return up, ledger

    def _nudge_all(self, up: _Upstream, granted: list[int]) -> None:
        """Nudge the waiters of the tickets the ledger just admitted: each one's next
        `_settle` takes its lease."""
        for tid in granted:
            ticket = up.waiters.pop(tid, None)
            if ticket is not None:
                ticket._nudge()

    def _move(self, up: _Upstream, ticket: int) -> str | None:
        ledger = up.ledger
        assert ledger is not None
        target, granted = ledger.move(ticket, self._clock.now())
        self._nudge_all(up, granted)
        return target

    def _release(self, up: _Upstream, ticket: int, slots: int = 1) -> None:
        ledger = up.ledger
        if ledger is None:
            up.open -= slots
        else:
            now = self._clock.now()
            self._nudge_all(up, ledger.release(ticket, now))
            self._expire(up, now)  # report tickets that lapsed during the release
        self._idle.check()

    def _wake_granted(self, up: _Upstream) -> None:
        """Nudge the waiters the ledger admitted since it was last asked."""
        ledger = up.ledger
        if ledger is not None:
            self._nudge_all(up, ledger.granted())

    def _expire(self, up: _Upstream, now: float) -> None:
        ledger = up.ledger
        assert ledger is not None
        expired = ledger.expire(now)
        if expired:
            retry = ledger.retry_after()
            for tid in expired:
                ticket = up.waiters.pop(tid)
                ticket._retry = retry
                ticket._end_with(_EXPIRED)
        self._wake_granted(up)  # an expired head may have let the next ones in

    def _is_idle(self) -> bool:
        return all((up.open if up.ledger is None else up.ledger.in_flight) == 0 for up in self._ups.values())
