"""The in-process gate's state: one `SlotLedger` per capped upstream (or an open count for
an uncapped one) with the waiters parked on it, and the operations that keep the two in
step, which the gate, its leases and its tickets all call."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from adapters.outbound.idle_signal import IdleSignal
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy
from ports.clock import Clock


class Waiter(Protocol):
    """A queue ticket as the ledger side sees it: ended (or nudged) from outside."""

    def _nudge(self) -> None: ...
    def _time_out(self, retry_after: int) -> None: ...
    def _drain(self) -> None: ...


class Upstream:
    """One upstream: its ledger (None when uncapped) and the waiters of its queue."""

    __slots__ = ("admitted", "key", "ledger", "open", "waiters")

    def __init__(self, key: str, policy: AdmissionPolicy | None, replica_limit: int | None = None) -> None:
        self.key = key
        if policy is None and replica_limit is not None:
            raise ValueError(f"upstream {key!r} has replicas but no admission policy")
        self.ledger = None if policy is None else SlotLedger(policy, replica_limit=replica_limit)
        self.open = 0  # leases held on an uncapped upstream
        self.admitted = 0  # leases ever granted on an uncapped upstream
        self.waiters: dict[int, Waiter] = {}  # queued ticket id -> ticket


class LedgerCore:
    """The upstreams, the clock and the idle signal, and what a release, a move or an expiry
    does to them: the ledger decides, the waiters it admitted or ended are told."""

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
        self._ups = {key: Upstream(key, policy, limits.get(key)) for key, policy in policies.items()}
        self._draining = False
        self._idle = IdleSignal(self._is_idle)

    def _nudge_all(self, up: Upstream, granted: list[int]) -> None:
        """Nudge the waiters of the tickets the ledger just admitted: each one's next
        `_settle` takes its lease."""
        for tid in granted:
            ticket = up.waiters.pop(tid, None)
            if ticket is not None:
                ticket._nudge()

    def _move(self, up: Upstream, ticket: int) -> str | None:
        ledger = up.ledger
        assert ledger is not None
        target, granted = ledger.move(ticket, self._clock.now())
        self._nudge_all(up, granted)
        return target

    def _release(self, up: Upstream, ticket: int, slots: int = 1) -> None:
        ledger = up.ledger
        if ledger is None:
            up.open -= slots
        else:
            now = self._clock.now()
            self._nudge_all(up, ledger.release(ticket, now))
            self._expire(up, now)  # report tickets that lapsed during the release
        self._idle.check()

    def _wake_granted(self, up: Upstream) -> None:
        """Nudge the waiters the ledger admitted since it was last asked."""
        ledger = up.ledger
        if ledger is not None:
            self._nudge_all(up, ledger.granted())

    def _expire(self, up: Upstream, now: float) -> None:
        ledger = up.ledger
        assert ledger is not None
        expired = ledger.expire(now)
        if expired:
            retry = ledger.retry_after()
            for tid in expired:
                up.waiters.pop(tid)._time_out(retry)
        self._wake_granted(up)  # an expired head may have let the next ones in

    def _is_idle(self) -> bool:
        return all((up.open if up.ledger is None else up.ledger.in_flight) == 0 for up in self._ups.values())
