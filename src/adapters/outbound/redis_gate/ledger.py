"""The ledger plumbing of `RedisAdmissionGate`: script calls, tickets' Redis side, fencing.

Kept apart from the public surface (gate.py) so each file stays readable; `LedgerCore`
holds all state shared with the tickets and the background loops.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from itertools import count
from typing import Any

from adapters.outbound.idle_signal import IdleSignal
from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.background import REDIS_DOWN, RedisHealth
from adapters.outbound.redis_gate.connection import RedisTarget, connect, run_scripts
from adapters.outbound.redis_gate.tickets import EXPIRED, LOST, WAITING, RedisLease, RedisTicket
from domain.admission import DEFAULT_RETRY_AFTER, EWMA_ALPHA, MAX_RETRY_AFTER, AdmissionPolicy
from ports.clock import Clock

log = logging.getLogger("gateway.admission.redis")

_COUNTER_NAMES = (
    "admitted", "queued", "rejected_full", "rejected_draining", "timed_out", "abandoned",
    "drained", "unavailable", "lost", "reclaimed",
)
FencedHook = Callable[[str, int], None]  # (reason, leases and tickets lost)


class Upstream:
    """Per-upstream local state: policy, keys, snapshot cache, counters, service time."""

    __slots__ = ("args", "cache", "counts", "deadlines", "key", "keys", "oldest", "open", "policy", "service",
                 "stamp")

    def __init__(self, key: str, policy: AdmissionPolicy | None, prefix: str) -> None:
        self.key, self.policy = key, policy
        self.keys, channel = scripts.upstream_keys(prefix, key)
        self.args: list[Any] = [0 if policy is None else policy.max_in_flight, channel]
        self.cache = (0, 0)  # (in_use, queued) as last read from Redis
        self.stamp = 0  # server time (us) of the reply `cache` came from
        self.deadlines = next(k for k in self.keys if k.endswith(":deadlines"))
        self.oldest: float | None = None  # local-clock arrival of the longest waiter, as last read
        self.counts = dict.fromkeys(_COUNTER_NAMES, 0)
        self.open = 0  # leases held on an uncapped upstream
        self.service: float | None = None  # EWMA of this process's service times

    def retry_after(self, ahead: int) -> int:
        """Same rule as the in-memory ledger, on this process's observed service times."""
        if self.service is None or self.policy is None:
            return DEFAULT_RETRY_AFTER
        est = math.ceil(self.service * (ahead + 1) / self.policy.max_in_flight)
        return min(MAX_RETRY_AFTER, max(1, est))


class LedgerCore:
    """State and Redis plumbing shared by the gate, its tickets and its loops."""

    def __init__(
        self, policies: Mapping[str, AdmissionPolicy | None], clock: Clock, redis_url: str | RedisTarget,
        lease_seconds: float = 10.0, key_prefix: str = "gateway", *,
        on_fenced: FencedHook | None = None, recheck_seconds: float = 1.0,
        refresh_seconds: float = 0.5, socket_timeout: float = 2.0,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self._clock = clock
        self._ups = {key: Upstream(key, policy, key_prefix) for key, policy in policies.items()}
        self._capped = [up for up in self._ups.values() if up.policy is not None]
        self._lease = float(lease_seconds)
        self._recheck = recheck_seconds
        self._refresh = refresh_seconds
        self.on_fenced = on_fenced
        self._redis = connect(redis_url, socket_timeout)
        self._scripts = {name: self._redis.register_script(src) for name, src in scripts.ALL.items()}
        self._tag = secrets.token_hex(4)
        self._ident = f"{socket.gethostname()}:{os.getpid()}:{self._tag}"
        self._generation = 0
        self._owner = f"{self._ident}:g0"
        self._registered = False
        self._register_lock = asyncio.Lock()
        self._last_renewal = -math.inf  # gate clock, taken BEFORE the renewal was sent
        self._tokens = count(1)
        self._tickets: dict[str, RedisTicket] = {}  # queued here, by token
        self._early: OrderedDict[str, None] = OrderedDict()  # grants seen before their ticket
        self._held: set[RedisLease] = set()
        self._pending: dict[str, tuple[Upstream, str]] = {}  # token -> (up, owner) to forget
        self._stale_owners: set[str] = set()  # old identities still to purge
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()
        self._draining = self._closed = False
        self._idle = IdleSignal(self._is_idle)
        self.fence_count = 0
        self.health = RedisHealth()

    # -- script calls ------------------------------------------------------------------

    async def _call(self, up: Upstream, name: str, *args: Any) -> tuple[int, int]:
        reply = await self._scripts[name](keys=up.keys, args=[*up.args, *args])
        return self._absorb(up, reply)

    async def _pipeline(self, name: str, *args: Any) -> list[int]:
        """The same script on every capped upstream, in one round trip."""
        script = self._scripts[name]
        replies = await run_scripts(self._redis, [(script, up.keys, [*up.args, *args]) for up in self._capped])
        return [self._absorb(up, r)[0] for up, r in zip(self._capped, replies, strict=True)]

    def _absorb(self, up: Upstream, reply: list[Any]) -> tuple[int, int]:
        code, value, in_use, queued, reclaimed, stamp = (int(x) for x in reply)
        if stamp >= up.stamp or stamp < up.stamp - 5_000_000:  # newer, or the clock stepped back
            up.cache, up.stamp = (in_use, queued), stamp
        if reclaimed:
            up.counts["reclaimed"] += reclaimed
            log.warning("redis admission: reclaimed %d entries of expired owners on %s",
                        reclaimed, up.key)
        return code, value

    async def _register(self) -> None:
        async with self._register_lock:
            if self._registered:
                return
            started = self._clock.now()
            await self._pipeline("heartbeat", self._owner, int(self._lease * 1000), 1)
            self._registered, self._last_renewal = True, started

    # -- tickets and leases ------------------------------------------------------------

    def _new_lease(self, up: Upstream, token: str, owner: str) -> RedisLease:
        up.counts["admitted"] += 1
        lease = RedisLease(self, up, token, owner, self._clock.now())
        self._held.add(lease)
        return lease

    async def _poll_ticket(self, ticket: RedisTicket) -> None:
        """One wait round: maintenance plus one ZRANK, in one script call."""
        up = ticket.up
        try:
            code, value = await self._call(up, "poll", ticket.owner, ticket.token)
        except REDIS_DOWN as error:
            up.counts["unavailable"] += 1
            self._pending[ticket.token] = (up, ticket.owner)
            ticket._end(LOST)
            log.warning("redis admission: waiter on %s lost Redis: %s", up.key, error)
            return
        if ticket._state != WAITING:
            return
        if code == scripts.ADMITTED:
            ticket._grant()
        elif code == scripts.QUEUED:
            ticket._position = value
        elif code == scripts.FENCED:
            self._fence("a waiter found this process's lease expired", ticket.owner)
            ticket._end(LOST)
        else:  # gone without a grant: the server's copy of the deadline passed first
            late = self._clock.now() >= ticket.deadline - 1.0
            up.counts["timed_out" if late else "lost"] += 1
            ticket._end(EXPIRED if late else LOST, up.retry_after(up.cache[1]))

    async def _expire_ticket(self, ticket: RedisTicket) -> None:
        """The queue deadline: leave the queue, unless a slot was granted just before."""
        up = ticket.up
        try:
            code, _ = await self._call(up, "cancel", ticket.owner, ticket.token, "timeout")
        except REDIS_DOWN:
            code = scripts.REJECTED  # the server expires the entry at its own deadline
            self._pending[ticket.token] = (up, ticket.owner)
        if ticket._state != WAITING:
            return
        if code == scripts.HOLDS:
            ticket._grant()
        else:
            up.counts["timed_out"] += 1
            ticket._end(EXPIRED, up.retry_after(up.cache[1]))

    async def _forget(self, up: Upstream, token: str, owner: str, abandoned: bool = False) -> None:
        """Take a token out of Redis (queued or holding a slot); retried if Redis is down.

        Detached from the caller: a hang-up re-cancelling the task cannot stop it.
        """
        async def run() -> None:
            try:
                code, _ = await self._call(up, "cancel", owner, token, "cancel")
            except REDIS_DOWN as error:
                self._pending[token] = (up, owner)
                log.warning("redis admission: cancel on %s deferred: %s", up.key, error)
                return
            if abandoned and code == scripts.WITHDRAWN:
                up.counts["abandoned"] += 1

        await self._detached(run())

    async def _release(self, lease: RedisLease) -> None:
        """Free a slot; a Redis failure is logged and retried by the heartbeat, never raised."""
        self._held.discard(lease)
        up = lease.up
        took = max(0.0, self._clock.now() - lease.granted_at)
        up.service = took if up.service is None else up.service + EWMA_ALPHA * (took - up.service)
        self._check_idle()
        if lease.lost.is_set():
            return  # fenced: the slot was reclaimed, the old owner is purged as a whole

        async def run() -> None:
            try:
                await self._call(up, "release", lease.owner, lease.token)
            except REDIS_DOWN as error:
                self._pending[lease.token] = (up, lease.owner)
                log.warning("redis admission: release on %s deferred: %s", up.key, error)

        await self._detached(run())

    # -- fencing, tasks, idleness ------------------------------------------------------

    def _fence(self, reason: str, owner: str) -> None:
        """This process's owner lease expired: everything it held may belong to others.

        Sets `lost` on every lease, fails every waiter with `AdmissionUnavailable`, takes
        a new owner identity (registered on next use) and purges the old one later.
        """
        if owner != self._owner:
            return  # this identity was fenced already
        self.fence_count += 1
        self._generation += 1
        self._owner = f"{self._ident}:g{self._generation}"
        self._registered = False
        self._stale_owners.add(owner)
        lost = 0
        for lease in list(self._held):
            lease.lost.set()
            lease.up.counts["lost"] += 1
            lost += 1
        self._held.clear()
        for ticket in list(self._tickets.values()):
            ticket.up.counts["lost"] += 1
            ticket._end(LOST)
            lost += 1
        self._pending = {t: e for t, e in self._pending.items() if e[1] != owner}
        log.error("redis admission: FENCED (%s): %d leases/tickets lost; new owner %s",
                  reason, lost, self._owner)
        self._check_idle()
        hook = self.on_fenced
        if hook is not None:
            try:
                hook(reason, lost)
            except Exception:
                log.exception("redis admission: on_fenced hook failed")

    async def _detached(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` to completion even if the awaiting task is cancelled meanwhile."""
        await asyncio.shield(self._spawn(coro))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _is_idle(self) -> bool:
        return not self._held and all(up.open == 0 for up in self._ups.values())

    def _check_idle(self) -> None:
        self._idle.check()
