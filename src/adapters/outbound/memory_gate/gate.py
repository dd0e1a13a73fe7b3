"""`InMemoryAdmissionGate`: the admission port over one process's ledgers (see the package)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from adapters.outbound.memory_gate.ledgers import LedgerCore, Upstream
from adapters.outbound.memory_gate.tickets import MemoryLease, MemoryTicket
from domain.admission.decisions import Outcome
from domain.admission.ledger import SlotLedger
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import Draining, QueueFull
from domain.replicas import Replica
from ports.admission import GateSnapshot

_COUNTER_NAMES = (
    "admitted",
    "queued",
    "rejected_full",
    "rejected_draining",
    "timed_out",
    "abandoned",
    "drained",
)


class InMemoryAdmissionGate(LedgerCore):
    """`ports.admission.AdmissionGate` for one process: cap, depth and order per upstream.

    `None` as an upstream's policy means uncapped: `enter` grants a lease at once.
    `replica_limits` (upstream key -> `[endpoints] max_in_flight`): the upstreams with
    replicas; each starts with none ready (requests queue) until `set_replicas`.
    """

    __slots__ = ()

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> MemoryLease | MemoryTicket:
        """A lease, or a queue ticket; KeyError for an upstream not configured.

        `consumer` places the ticket under `fairness = "fair"` or `"tokens"` and counts toward
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
            return MemoryLease(self, up, 0, slots)
        ledger.check(slots)
        now = self._clock.now()
        if ledger.queued:
            self._expire(up, now)
        decision = ledger.arrive(now, consumer, slots, prefer, max_extra)
        self._wake_granted(up)
        outcome = decision.outcome
        if outcome is Outcome.ADMITTED:
            _, replica = ledger.binding(decision.ticket)
            return MemoryLease(self, up, decision.ticket, slots, replica)
        if outcome is Outcome.QUEUED:
            ticket = MemoryTicket(self, up, ledger, decision.ticket, decision.deadline)
            up.waiters[decision.ticket] = ticket
            return ticket
        if outcome is Outcome.REJECTED:
            raise QueueFull(decision.retry_after)
        raise Draining(decision.retry_after)  # closed by `drain`; the ledger counted it

    def metered(self, upstream: str) -> bool:
        """True for an upstream under `fairness = "tokens"`; KeyError for one not configured."""
        ledger = self._ups[upstream].ledger
        return ledger is not None and ledger.tokens is not None

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        """Add to `consumer`'s token service on `upstream` (ignored unless it is `metered`). No
        dispatch follows: a charge frees no slot, it only orders the next ones."""
        ledger = self._ups[upstream].ledger
        if ledger is not None and ledger.tokens is not None:
            ledger.tokens.charge(consumer.name, consumer.weight, input_tokens, output_tokens)

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
                    up.waiters.pop(tid)._drain()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no lease is held; False if `timeout` passes first."""
        return await self._idle.wait(timeout)

    # -- internals ---------------------------------------------------------------------

    def _replicated(self, upstream: str) -> tuple[Upstream, SlotLedger]:
        up = self._ups[upstream]
        ledger = up.ledger
        if ledger is None or ledger.replicas is None:
            raise KeyError(f"upstream {upstream!r} has no replicas")
        self._expire(up, self._clock.now())
        return up, ledger
