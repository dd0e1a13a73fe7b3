"""The ledger plumbing of `RedisAdmissionGate`: script calls, fencing, local state.

Kept apart from the public surface (gate.py) so each file stays readable; `LedgerCore`
holds all state shared with the leases, the tickets and the background loops.

The package's modules import in one direction only (no cycle; tests/unit/adapters/
test_redis_gate_imports.py checks it): `scripts`, `connection` < `upstream` < `ledger` <
`leases` < `tickets`, `background` < `gate`. This module knows the leases and tickets only
through the two small protocols below, which `leases` and `tickets` implement.
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
from typing import Any, Protocol

from adapters.outbound.idle_signal import IdleSignal
from adapters.outbound.redis_gate import scripts
from adapters.outbound.redis_gate.connection import REDIS_DOWN, RedisTarget, connect, run_scripts
from adapters.outbound.redis_gate.upstream import Upstream
from domain.admission.policy import AdmissionPolicy
from ports.clock import Clock

log = logging.getLogger("gateway.admission.redis")

FencedHook = Callable[[str, int], None]  # (reason, leases and tickets lost)


class RedisHealth:
    """What this process saw of Redis lately, for the metrics: `gateway_redis_reachable`
    (the refresher's and heartbeat's last call answered) and
    `gateway_lease_heartbeat_failures_total` (renewals that did not reach Redis)."""

    __slots__ = ("heartbeat_failures", "reachable")

    def __init__(self) -> None:
        self.reachable = True
        self.heartbeat_failures = 0


class Held(Protocol):
    """A lease as the ledger sees it (`leases.RedisLease`)."""

    up: Upstream
    lost: asyncio.Event


class Waiter(Protocol):
    """A queue ticket as the ledger and its loops see it (`tickets.RedisTicket`)."""

    up: Upstream
    token: str
    owner: str

    def _grant(self, replica: str | None) -> None: ...
    def _lose(self) -> None: ...
    def _drain(self) -> None: ...
    def _nudge(self) -> None: ...


class LedgerCore:
    """State and Redis plumbing shared by the gate, its tickets and its loops."""

    def __init__(
        self, policies: Mapping[str, AdmissionPolicy | None], clock: Clock, redis_url: str | RedisTarget,
        lease_seconds: float = 10.0, key_prefix: str = "gateway", *,
        on_fenced: FencedHook | None = None, recheck_seconds: float = 1.0,
        refresh_seconds: float = 0.5, socket_timeout: float = 2.0,
        replica_limits: Mapping[str, int] | None = None,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        limits = dict(replica_limits or {})
        unknown = sorted(set(limits) - set(policies))
        if unknown:
            raise ValueError(f"replica limits for unknown upstreams: {', '.join(unknown)}")
        self._clock = clock
        self._ups = {key: Upstream(key, policy, key_prefix, limits.get(key)) for key, policy in policies.items()}
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
        self._tickets: dict[str, Waiter] = {}  # queued here, by token
        self._early: OrderedDict[str, str] = OrderedDict()  # grants seen before their ticket -> replica
        self._held: set[Held] = set()
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

    async def _call(self, up: Upstream, name: str, *args: Any) -> tuple[int, int, str | None]:
        """One script on one upstream: (code, value, replica the token is bound to or None).
        The upstream's pending charges go with it (`Upstream.take_charges`)."""
        reply = await self._scripts[name](keys=up.keys, args=[*up.args, up.take_charges(), *args])
        return self._absorb(up, reply)

    async def _pipeline(self, name: str, *args: Any) -> list[int]:
        """The same script on every capped upstream, in one round trip."""
        script = self._scripts[name]
        calls = [(script, up.keys, [*up.args, up.take_charges(), *args]) for up in self._capped]
        replies = await run_scripts(self._redis, calls)
        return [self._absorb(up, r)[0] for up, r in zip(self._capped, replies, strict=True)]

    def _absorb(self, up: Upstream, reply: list[Any]) -> tuple[int, int, str | None]:
        code, value, in_use, queued, reclaimed, stamp = (int(x) for x in reply[:6])
        replica, counts, by_priority = reply[6], reply[7], reply[8]
        if stamp >= up.stamp or stamp < up.stamp - 5_000_000:  # newer, or the clock stepped back
            up.cache, up.stamp = (in_use, queued), stamp
            up.by_priority = {int(by_priority[i]): int(by_priority[i + 1]) for i in range(0, len(by_priority), 2)}
            if up.replica_limit is not None:
                up.replica_counts = {counts[i]: int(counts[i + 1]) for i in range(0, len(counts), 2)}
        if reclaimed:
            up.counts["reclaimed"] += reclaimed
            log.warning("redis admission: reclaimed %d entries of expired owners on %s",
                        reclaimed, up.key)
        return code, value, replica or None

    async def _register(self) -> None:
        async with self._register_lock:
            if self._registered:
                return
            started = self._clock.now()
            await self._pipeline("heartbeat", self._owner, int(self._lease * 1000), 1)
            self._registered, self._last_renewal = True, started

    # -- tickets and leases ------------------------------------------------------------

    async def _forget(self, up: Upstream, token: str, owner: str, abandoned: bool = False) -> None:
        """Take a token out of Redis (queued or holding a slot); retried if Redis is down.

        Detached from the caller: a hang-up re-cancelling the task cannot stop it.
        """
        async def run() -> None:
            try:
                code, _, _ = await self._call(up, "cancel", owner, token, "cancel")
            except REDIS_DOWN as error:
                self._pending[token] = (up, owner)
                log.warning("redis admission: cancel on %s deferred: %s", up.key, error)
                return
            if abandoned and code == scripts.WITHDRAWN:
                up.counts["abandoned"] += 1

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
            ticket._lose()
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
