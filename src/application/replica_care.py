"""What every upstream call on a replica tells the replica's health, and the one safe retry.

For an upstream with `[endpoints]` (docs/operations.md "Replica health, load and affinity"):

- **Outcomes.** After each call on a replica: a 2xx head is a success (a body that then
  fails too: the replica answered); a failure is reported with its `FailureKind`
  (`GatewayError.failure`); a 4xx, a client that went away or a lease lost to the shared
  ledger report nothing. `domain.ejection.OutlierDetector` (one per upstream, per process)
  decides; an ejection is told to the gate (`AdmissionGate.set_ejected`, the whole set),
  logged once and counted (`EjectionListener`). A timer on the event loop ends it when its
  time is over: the gate is told again and the return logged once.
- **The one safe retry.** A call that failed before the replica could have started
  generating (`domain.upstream_failures.safe_to_retry`) is sent once more, to the replica
  its lease moves to (`SlotLease.move`: the admission is kept, the cap never exceeded);
  the record's `endpoint` becomes the new replica and `retried_from` the first one. No
  other replica with room: the first error is the answer. A stream is retried only while
  it opens (the client raises head failures there), before its first batch.

The ready replicas come from discovery (`set_ready`, a `ReplicaWatch` listener), else from
the gate's view.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TypeVar

from application.slots import to_replica, unless_lost
from domain.ejection import EjectionPolicy, OutlierDetector
from domain.errors import GatewayError
from domain.records import RequestRecord
from domain.replicas import ReplicaState, endpoint_of
from domain.upstream_failures import FailureKind, safe_to_retry
from ports.admission import AdmissionGate, SlotLease
from ports.clock import Clock

log = logging.getLogger("gateway.replicas")

T = TypeVar("T")
EjectionListener = Callable[[str, str], None]
"""Told (upstream, replica address) on each ejection (`gateway_endpoint_ejections_total`)."""
KnownListener = Callable[[str, frozenset[str]], None]
"""Told (upstream, the ready replicas) on each discovery answer (metric children made at 0)."""

_READY = (ReplicaState.READY, ReplicaState.EJECTED)
_SLACK = 0.001  # a timer fires this much after an ejection's end: `refresh` then finds it over


class ReplicaCare:
    """Every upstream's replica health in this process, and the calls that report to it."""

    __slots__ = ("_clock", "_detectors", "_ejected", "_gate", "_known", "_listeners", "_ready", "_timers")

    def __init__(
        self, gate: AdmissionGate, clock: Clock, policies: Mapping[str, EjectionPolicy] | None = None,
        listeners: Sequence[EjectionListener] = (), known: Sequence[KnownListener] = (),
    ) -> None:
        """`policies`: the upstreams whose replicas may be ejected."""
        self._gate = gate
        self._clock = clock
        self._detectors = {name: OutlierDetector(policy) for name, policy in (policies or {}).items()}
        self._listeners = list(listeners)
        self._known = list(known)
        self._ready: dict[str, frozenset[str]] = {}
        self._ejected: dict[str, frozenset[str]] = {}  # as last told to the gate
        self._timers: dict[str, asyncio.TimerHandle] = {}

    # -- discovery and the timers -----------------------------------------------------------

    def set_ready(self, upstream: str, ready: frozenset[str]) -> None:
        """A discovery answer (after the gate was told it): ejections the smaller set cannot keep
        end now; replicas no longer known are forgotten."""
        self._ready[upstream] = ready
        for listener in self._known:
            listener(upstream, ready)
        detector = self._detectors.get(upstream)
        if detector is None:
            return
        detector.retain(ready | {r.address for r in self._gate.replicas(upstream)})
        self._settle(upstream, detector)

    def close(self) -> None:
        """Stop the timers (at shutdown)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def ejected(self, upstream: str) -> frozenset[str]:
        """The replicas of `upstream` ejected now (as told to the gate)."""
        return self._ejected.get(upstream, frozenset())

    def _ready_of(self, upstream: str) -> frozenset[str]:
        ready = self._ready.get(upstream)
        if ready is None:
            ready = frozenset(r.address for r in self._gate.replicas(upstream) if r.state in _READY)
        return ready

    def _settle(self, upstream: str, detector: OutlierDetector) -> None:
        """End what is over, tell the gate the ejected set if it changed, time the next end."""
        now, ready = self._clock.now(), self._ready_of(upstream)
        for address in detector.refresh(now, ready):
            log.info("upstream %s replica %s returns after its ejection", upstream, endpoint_of(address))
        ejected = detector.ejected(now, ready)
        if ejected != self._ejected.get(upstream, frozenset()):
            self._ejected[upstream] = ejected
            self._gate.set_ejected(upstream, ejected)
        timer = self._timers.pop(upstream, None)
        if timer is not None:
            timer.cancel()
        ends = [until for address in ejected if (until := detector.until(address, now)) is not None]
        if ends:
            loop = asyncio.get_running_loop()
            self._timers[upstream] = loop.call_later(min(ends) - now + _SLACK, self._due, upstream)

    def _due(self, upstream: str) -> None:
        self._timers.pop(upstream, None)
        detector = self._detectors.get(upstream)
        if detector is not None:
            self._settle(upstream, detector)

    # -- outcomes -----------------------------------------------------------------------------

    def succeeded(self, upstream: str, address: str) -> None:
        """A 2xx head from the replica."""
        detector = self._detectors.get(upstream)
        if detector is not None:
            detector.success(address, self._clock.now())

    def failed(self, upstream: str, address: str, kind: FailureKind | None) -> None:
        """A failed call on the replica; `kind` None (a 4xx, an unclassified error): nothing."""
        detector = self._detectors.get(upstream)
        if detector is None or kind is None:
            return
        if kind is FailureKind.AFTER_HEAD:  # the head was a 2xx: the replica answered
            detector.success(address, self._clock.now())
            return
        ejection = detector.failure(address, kind, self._clock.now(), self._ready_of(upstream))
        if ejection is None:
            return
        log.warning("upstream %s replica %s ejected for %gs (%d failures in a row; ejection %d in a row)",
                    upstream, endpoint_of(address), ejection.seconds, detector.policy.consecutive_failures,
                    ejection.times)  # fmt: skip
        for listener in self._listeners:
            listener(upstream, address)
        self._settle(upstream, detector)

    # -- the calls ----------------------------------------------------------------------------

    def call(
        self, upstream: str, lease: SlotLease, record: RequestRecord | None, call: Callable[..., Awaitable[T]],
    ) -> Awaitable[T]:
        """`call(replica=...)` on the lease's replica, aborted if the lease is lost, its outcome
        reported; once more on another replica after a failure that is safe to retry. Without a
        replica (no `[endpoints]`): `call()` as it is."""
        if getattr(lease, "replica", None) is None:  # a gate without [endpoints] binds none
            return unless_lost(call(), lease)
        return self._call_on_replica(upstream, lease, record, call)

    def open(
        self, upstream: str, lease: SlotLease, record: RequestRecord | None,
        opener: Callable[..., AbstractAsyncContextManager[T]],
    ) -> AbstractAsyncContextManager[T]:
        """`opener(replica=...)` entered on the lease's replica, its outcome reported; a failure
        while it opens (the answer's head; nothing of the answer reached anyone yet) that is safe
        to retry opens it once more on another replica. Without a replica: `opener()`."""
        if getattr(lease, "replica", None) is None:
            return opener()
        return self._open_on_replica(upstream, lease, record, opener)

    async def _call_on_replica(
        self, upstream: str, lease: SlotLease, record: RequestRecord | None, call: Callable[..., Awaitable[T]],
    ) -> T:
        for attempt in (1, 2):
            target = to_replica(lease, record)
            replica = target["replica"]
            try:
                result = await unless_lost(call(**target), lease)
            except GatewayError as error:
                self.failed(upstream, replica, error.failure)
                if attempt == 2 or not await self._moved(lease, error, replica, record):
                    raise
                continue
            self.succeeded(upstream, replica)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    @asynccontextmanager
    async def _open_on_replica(
        self, upstream: str, lease: SlotLease, record: RequestRecord | None,
        opener: Callable[..., AbstractAsyncContextManager[T]],
    ) -> AsyncIterator[T]:
        async with AsyncExitStack() as stack:
            for attempt in (1, 2):
                target = to_replica(lease, record)
                replica = target["replica"]
                try:
                    opened = await stack.enter_async_context(opener(**target))
                except GatewayError as error:
                    self.failed(upstream, replica, error.failure)
                    if attempt == 2 or not await self._moved(lease, error, replica, record):
                        raise
                    continue
                self.succeeded(upstream, replica)
                break
            yield opened

    async def _moved(self, lease: SlotLease, error: GatewayError, replica: str, record: RequestRecord | None) -> bool:
        """Move the lease for the one safe retry; False (nothing changed) when it may not or cannot.
        A client that has gone cancels the task (never here); nothing of the answer was sent yet."""
        if not safe_to_retry(error.failure):
            return False
        try:
            target = await lease.move()
        except GatewayError:  # the shared ledger cannot be reached: the first error is the answer
            return False
        if target is None:
            return False
        if record is not None:
            record.retried_from = endpoint_of(replica)
        return True
