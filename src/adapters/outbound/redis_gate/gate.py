"""`RedisAdmissionGate`: one cap and one queue per upstream shared by every process.

The layout, the scripts and the failure model are described in the package docstring
and in docs/redis-ledger.md; the plumbing lives in `ledger.py` (per-upstream state in
`upstream.py`), leases and tickets in `leases.py` and `tickets.py`, the loops in
`background.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from adapters.outbound.redis_gate import background, scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN, prepare
from adapters.outbound.redis_gate.leases import OpenLease, RedisLease, new_lease
from adapters.outbound.redis_gate.ledger import LedgerCore, log
from adapters.outbound.redis_gate.tickets import RedisTicket
from adapters.outbound.redis_gate.upstream import Upstream
from domain.admission.fair_order import tag_step
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import AdmissionUnavailable, Draining, QueueFull
from domain.replicas import Replica
from ports.admission import GateSnapshot


class RedisAdmissionGate(LedgerCore):
    """`ports.admission.AdmissionGate` on Redis: correct across processes and pods.

    Same public surface as `InMemoryAdmissionGate` (`enter`, `snapshot`, `upstreams`,
    `counters`, `drain`, `wait_idle`, `set_replicas`, `set_ejected`, `set_saturated`,
    `replicas`; `RedisLease.move`) plus `start`/`close` for
    the app lifespan; the constructor (in `LedgerCore`) takes the policies and clock
    first, like it does, and `replica_limits` like it does.
    `on_fenced(reason, lost)` is called when this process finds out its heartbeat lease
    expired: every lease it held has its `lost` event set by then.
    """

    # -- lifespan ----------------------------------------------------------------------

    async def start(self) -> None:
        """Register this process and start heartbeat, pub/sub listener and refresher.

        Never fails because Redis is down: capped upstreams answer `AdmissionUnavailable`
        until it is back, and the loops keep retrying.
        """
        if not self._capped or self._loops:
            return
        try:
            await prepare(self._redis)
            await self._register()
        except REDIS_DOWN as error:
            log.warning("redis admission: cannot register at start (%s); retrying", error)
        self._loops = [
            asyncio.create_task(background.heartbeat_loop(self), name="redis-gate-heartbeat"),
            asyncio.create_task(background.listen_loop(self), name="redis-gate-listener"),
            asyncio.create_task(background.refresh_loop(self), name="redis-gate-refresh"),
        ]
        try:
            async with asyncio.timeout(1.0):
                await self._subscribed.wait()
        except TimeoutError:
            pass

    async def close(self, *, give_back: bool = True) -> None:
        """Stop the loops, give back whatever this process still holds, close Redis.

        `give_back=False` leaves this process's entries to expire with its lease, which
        is exactly what the other processes see when it crashes (used by the tests).
        """
        self._closed = True  # the loops also check it: a swallowed cancel cannot keep one alive
        for task in self._loops:
            task.cancel()
        if self._loops:
            await asyncio.wait(self._loops, timeout=max(3.0, self._lease / 3 + 1.0))
        self._loops = []
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)
        if self._registered and give_back:
            try:
                await self._pipeline("purge", self._owner)
            except REDIS_DOWN as error:
                log.warning("redis admission: purge at close failed (%s)", error)
        await self._redis.aclose()

    # -- the port ----------------------------------------------------------------------

    async def enter(
        self, upstream: str, consumer: Consumer = ANONYMOUS, slots: int = 1,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> RedisLease | OpenLease | RedisTicket:
        """`ports.admission.AdmissionGate.enter`: `prefer`/`max_extra` (affinity) weigh in the
        enter script's pick of a request admitted at once only."""
        up = self._ups[upstream]
        up.check(slots)  # TooManySequences: never admissible, whatever the shared state
        if self._draining:
            up.counts["rejected_draining"] += 1
            raise Draining(1)
        if up.policy is None:
            up.open += slots
            up.counts["admitted"] += 1
            return OpenLease(self, up, slots)
        if self._closed:
            raise AdmissionUnavailable(1)
        token = f"{self._tag}.{next(self._tokens)}"
        task = asyncio.ensure_future(self._enter(up, token, consumer, slots, prefer, max_extra))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:  # hung up mid-call: undo whatever the script did
            task.add_done_callback(self._undo_enter)
            raise

    def snapshot(self, upstream: str) -> GateSnapshot:
        up = self._ups[upstream]
        if up.policy is None:
            return GateSnapshot(in_use=up.open, queued=0, limit=None, queue_limit=None)
        in_use, queued = up.cache
        oldest = None if not queued or up.oldest is None else max(0.0, self._clock.now() - up.oldest)
        return GateSnapshot(
            in_use=in_use, queued=queued, limit=up.policy.max_in_flight,
            queue_limit=up.policy.queue_depth, oldest_wait_seconds=oldest,
            queued_by_priority=up.queued_by_priority(),
        )

    def metered(self, upstream: str) -> bool:
        """True for an upstream under `fairness = "tokens"`; KeyError for one not configured."""
        return self._ups[upstream].metered

    def charge(self, upstream: str, consumer: Consumer, input_tokens: float, output_tokens: float) -> None:
        """Add to `consumer`'s token service on `upstream` (ignored unless it is `metered`).
        Never waits: the charge joins this process's pending batch for the upstream, which
        the next script call on it carries and applies before anything else (a release
        after a `settle` thus dispatches on it), or the refresher's within its 0.5 s."""
        up = self._ups[upstream]
        if up.metered:
            up.charge(consumer.name, consumer.weight, input_tokens, output_tokens)

    def upstreams(self) -> list[str]:
        return list(self._ups)

    def set_replicas(self, upstream: str, ready: Iterable[str]) -> None:
        """This process's discovery view of an upstream's replicas (KeyError for one
        without). Every later script call passes it; a `maintain` call is scheduled at
        once so that queued requests are promoted if the new view makes room."""
        up = self._replicated(upstream)
        up.set_ready(ready)
        self._replicas_changed(up)

    def set_ejected(self, upstream: str, ejected: Iterable[str]) -> None:
        """The replicas this process's outlier detection has ejected now (the whole set;
        KeyError for an upstream without replicas): every later script call leaves them out
        of the eligible view it passes, so they get no new request and their slots leave the
        live cap, as a draining replica's do (`replicas()` still says EJECTED). A `maintain`
        call is scheduled at once: queued requests go in when one returns."""
        self._replicated(upstream).set_health(ejected=ejected)
        self._replicas_changed(self._ups[upstream])

    def set_saturated(self, upstream: str, saturated: Iterable[str]) -> None:
        """The replicas whose own metrics say they have no room now (the whole set; KeyError
        for an upstream without replicas): passed to every later script call as in the cap
        but never picked. A `maintain` call is scheduled at once, as for `set_replicas`."""
        self._replicated(upstream).set_health(saturated=saturated)
        self._replicas_changed(self._ups[upstream])

    def replicas(self, upstream: str) -> list[Replica]:
        """This process's ready replicas and every replica still holding slots, with the
        shared counts as last read (every script reply carries them; the refresher reads
        them every `refresh_seconds`); [] without replicas."""
        return self._ups[upstream].view()

    def counters(self, upstream: str) -> dict[str, int]:
        """This process's cumulative outcomes: the in-memory gate's keys plus
        unavailable (Redis unreachable), lost (leases/tickets lost to fencing) and
        reclaimed (entries of dead owners this process reclaimed)."""
        return dict(self._ups[upstream].counts)

    def drain(self) -> None:
        """Admit nothing more here; fail this process's queued waiters with `Draining`.

        Other processes keep admitting; leases already granted run on as usual.
        """
        self._draining = True
        for ticket in list(self._tickets.values()):
            ticket.up.counts["drained"] += 1
            ticket._drain()
            self._spawn(self._forget(ticket.up, ticket.token, ticket.owner))

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until this process holds no lease; False if `timeout` passes first."""
        return await self._idle.wait(timeout)

    # -- enter and its tickets ---------------------------------------------------------

    def _replicated(self, upstream: str) -> Upstream:
        up = self._ups[upstream]
        if up.replica_limit is None:
            raise KeyError(f"upstream {upstream!r} has no replicas")
        return up

    def _replicas_changed(self, up: Upstream) -> None:
        """The view changed: promote under it at once (queued requests may fit now)."""
        if self._closed or not self._loops:
            return  # not started yet: the first call carries the view
        self._spawn(self._wake_replicas(up))

    async def _wake_replicas(self, up: Upstream) -> None:
        try:
            await self._call(up, "maintain", self._owner)
        except REDIS_DOWN as error:  # the refresher promotes within its interval anyway
            log.warning("redis admission: replica update on %s not applied yet: %s", up.key, error)

    async def _enter(
        self, up: Upstream, token: str, consumer: Consumer, slots: int,
        prefer: Sequence[str] = (), max_extra: int = 0,
    ) -> RedisLease | RedisTicket:
        policy = up.policy
        assert policy is not None
        deadline = self._clock.now() + policy.queue_timeout_seconds
        fair = policy.fairness == "fair"
        args = (
            token, policy.queue_depth, int(policy.queue_timeout_seconds * 1000),
            1 if fair else 2 if up.metered else 0, consumer.name,
            scripts.band(consumer.priority) if fair or up.metered else "", tag_step(consumer.weight),
            policy.max_queued_per_consumer or 0, scripts.TAGS_GRACE_MS, slots, int(consumer.priority),
            up.preferred(prefer) if prefer and up.replica_limit is not None else "", int(max_extra),
        )
        owner = self._owner
        try:
            if not self._registered:
                await self._register()
                owner = self._owner
            code, value, replica = await self._call(up, "enter", owner, *args)
            if code == scripts.FENCED:
                self._fence("enter found this process's lease expired", owner)
                await self._register()
                owner = self._owner
                code, value, replica = await self._call(up, "enter", owner, *args)
        except REDIS_DOWN as error:
            up.counts["unavailable"] += 1
            self._pending[token] = (up, owner)  # the script may have run: undo it later
            log.warning("redis admission: enter on %s failed: %s", up.key, error)
            raise AdmissionUnavailable(1) from error
        if owner != self._owner and code in (scripts.ADMITTED, scripts.QUEUED):
            up.counts["lost"] += 1  # fenced while the call was in flight: the old owner's
            raise AdmissionUnavailable(1)  # entries are purged, this one with them
        if code == scripts.ADMITTED:
            self._early.pop(token, None)  # a fair newcomer admitted at once was also published
            return new_lease(self, up, token, owner, slots, replica)
        if code == scripts.QUEUED:
            if self._draining:
                up.counts["rejected_draining"] += 1
                self._spawn(self._forget(up, token, owner))
                raise Draining(1)
            up.counts["queued"] += 1
            ticket = RedisTicket(self, up, token, owner, deadline, value, slots)
            self._tickets[token] = ticket
            early = self._early.pop(token, None)
            if early is not None:  # promoted before we knew the token
                ticket._grant(early or None)
            return ticket
        if code == scripts.REJECTED:
            up.counts["rejected_full"] += 1
            raise QueueFull(up.retry_after(up.cache[1]))
        raise AdmissionUnavailable(1)  # fenced again right after registering

    def _undo_enter(self, task: asyncio.Task[RedisLease | RedisTicket]) -> None:
        if task.cancelled() or task.exception() is not None:
            return  # nothing granted (a failed call left its token in `_pending`)
        entry = task.result()
        self._spawn(entry.cancel() if isinstance(entry, RedisTicket) else entry.release())
