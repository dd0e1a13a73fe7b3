"""Admission: the per-upstream gate in front of a model server's sequence slots."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

from domain.consumers import ANONYMOUS, Consumer
from domain.replicas import Replica


class GateSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The state of one upstream's gate now (for metrics and health)."""

    in_use: int
    queued: int
    limit: int | None  # None: the upstream is not capped
    queue_limit: int | None
    # Waiting requests per consumer priority (only priorities with some; sums to `queued`);
    # None while nobody waits, or from a gate that does not count them.
    queued_by_priority: dict[int, int] | None = None
    # How long the longest-waiting request has waited (seconds); None while nobody waits,
    # or from a gate that does not know it.
    oldest_wait_seconds: float | None = None


class SlotLease(Protocol):
    """Granted slots. `release` gives back all of them (and the replica's), is idempotent
    and safe to call from `finally`."""

    queued: bool  # always False: tells a lease from a ticket without isinstance
    # Set when the slot is no longer this process's (a shared ledger fenced it): work on
    # it must stop, or the cap would be exceeded. Never set by a one-process gate.
    lost: asyncio.Event
    # True when `lost` can ever be set (a lease in a shared ledger); False lets a caller skip
    # watching it (the watch costs a task per call).
    losable: bool
    slots: int  # sequence slots this lease holds (k >= 1)
    # The replica bound at admission (its base URL, e.g. "http://127.0.0.2:8080"); None
    # for an upstream without [endpoints].
    replica: str | None

    async def release(self) -> None: ...

    async def move(self) -> str | None:
        """The one safe retry (`domain.upstream_failures.safe_to_retry`): move this lease's slots
        to another eligible replica with room, atomically (the upstream's count never changes,
        no replica goes over its limit, the cap is never exceeded), and return it (`replica`
        names it from then on); None, and nothing changes, when no other replica has room or
        the upstream has no replicas. Raises `AdmissionUnavailable` when the shared backend
        cannot be reached (nothing changed)."""
        ...


class QueueTicket(Protocol):
    """A request waiting in an upstream's queue (arrival order, or fair order: see
    `domain.admission.fair_order`; under `fair` a position can go up when a newcomer is
    placed ahead)."""

    queued: bool  # always True

    def position(self) -> int:
        """1-based position in the queue now (1 = next admitted); O(log n)."""
        ...

    async def wait(self, timeout: float) -> SlotLease | None:
        """Wait up to `timeout` seconds for a slot.

        Returns the lease once granted, or None if still queued when `timeout` passes.
        Raises `QueueTimeout` (and leaves the queue) when the queue wait limit passes.
        Cancelling the waiting task leaves the queue; a slot granted in that same
        instant is given back.
        """
        ...

    async def cancel(self) -> None:
        """Leave the queue (idempotent); a slot granted meanwhile is given back."""
        ...


class AdmissionGate(Protocol):
    """One gate per upstream key, shared by every surface.

    Nothing about the request but its upstream key and its consumer reaches the gate:
    admission cannot depend on the dialect a request arrived through.
    """

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> SlotLease | QueueTicket:
        """Take `slots` (k) slots now, or a place in the queue (placed by `consumer`'s
        priority and weight under `fairness = "fair"`; `QueueFull` also when the consumer
        already has `max_queued_per_consumer` waiting).

        All k at once or none: a queued k-request waits in its place until k are free
        (head-of-line: later requests never overtake it). With replicas, the request is
        bound to one ready replica with k free (`domain.replicas.pick`), atomically with
        the slots; `SlotLease.replica` names it. `prefer` (affinity, best first) and
        `max_extra`: a request admitted at once goes to the first preferred replica with
        room whose in flight is within `max_extra` of the least loaded (`domain.replicas.pick`);
        one admitted later from the queue goes to the least loaded.

        Raises `TooManySequences` when k is above the upstream's cap (admission
        `max_in_flight`) or above one replica's `[endpoints] max_in_flight` (it could
        never be admitted), `QueueFull` when the queue is full, `Draining` while shutting
        down and `AdmissionUnavailable` when the shared backend cannot be reached. An
        uncapped upstream always gets a lease at once.
        """
        ...

    def metered(self, upstream: str) -> bool:
        """True when `upstream`'s queue orders consumers by the tokens they were served
        (`fairness = "tokens"`, `domain.admission.token_order`): its requests then `charge`
        what they are served. False for every other upstream (nothing to charge)."""
        ...

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        """Add tokens served to `consumer`'s service on a `metered` upstream (negative: a
        correction of an estimate); ignored for any other. Never waits: callers batch their
        charges (`application.service_charge`), and a shared backend sends them with its
        next round trip (or within 0.5 s)."""
        ...

    def set_replicas(self, upstream: str, ready: Iterable[str]) -> None:
        """The replica addresses this process's discovery sees now (an upstream with
        replicas; KeyError for another). New ones get requests; missing ones drain (their
        requests finish, they get no new one, forgotten at 0; one that returns keeps its
        counts). Queued requests are admitted at once when capacity appears."""
        ...

    def set_ejected(self, upstream: str, ejected: Iterable[str]) -> None:
        """The replicas this process's outlier detection has ejected now (the whole set; KeyError
        for an upstream without replicas): no new request, their slots leave the live cap
        until they return (`domain.ejection`). Queued requests are admitted at once when
        capacity comes back."""
        ...

    def set_saturated(self, upstream: str, saturated: Iterable[str]) -> None:
        """The replicas whose own metrics say they have no room now (the whole set; KeyError for
        an upstream without replicas; `domain.load_reports`): no new request for them; their
        slots stay in the cap."""
        ...

    def replicas(self, upstream: str) -> list[Replica]:
        """The upstream's replicas now, ready and draining, in address order (metrics,
        status); [] for an upstream without [endpoints]."""
        ...

    def snapshot(self, upstream: str) -> GateSnapshot: ...

    def upstreams(self) -> list[str]: ...

    async def start(self) -> None:
        """Called once the event loop runs, before the first request (connect, register)."""
        ...

    async def close(self) -> None:
        """Called at shutdown, after the last request."""
        ...
