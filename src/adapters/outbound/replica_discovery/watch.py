"""`ReplicaWatch`: every upstream's replica discovery, run from app start to app stop.

One discovery per upstream with `[endpoints]` (never per request): started once the
admission gate is connected, before the first request; each answer (the first one
before `start` returns, then every change) is told to every listener with the
upstream's name: the gate (`AdmissionGate.set_replicas`) and the upstream client's
replica sessions (`ReplicaSessions.retain`). Stopped after the last request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence

from ports.discovery import ReplicaDiscovery

UpstreamListener = Callable[[str, frozenset[str]], None]
"""Told (upstream name, the ready replicas' base URLs) on every answer."""


class ReplicaWatch:
    __slots__ = ("_discoveries", "_listeners", "_ready", "_started")

    def __init__(self, discoveries: Mapping[str, ReplicaDiscovery], listeners: Sequence[UpstreamListener]) -> None:
        self._discoveries = dict(discoveries)
        self._listeners = list(listeners)
        self._ready: dict[str, frozenset[str]] = {}
        self._started: list[ReplicaDiscovery] = []

    def upstreams(self) -> list[str]:
        return list(self._discoveries)

    def ready(self, upstream: str) -> frozenset[str] | None:
        """The upstream's last answer; None for an upstream without `[endpoints]` (or before start)."""
        return self._ready.get(upstream)

    def without_replicas(self) -> list[str]:
        """The upstreams with `[endpoints]` whose discovery answers no ready replica now."""
        return [name for name in self._discoveries if not self._ready.get(name)]

    async def start(self) -> None:
        """Every discovery at once (a slow resolver delays the start by at most its look-up bound)."""
        async def one(name: str, discovery: ReplicaDiscovery) -> None:
            await discovery.start(functools.partial(self._tell, name))
            self._started.append(discovery)

        results = await asyncio.gather(*(one(n, d) for n, d in self._discoveries.items()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                await self.close()
                raise result

    def _tell(self, upstream: str, ready: frozenset[str]) -> None:
        self._ready[upstream] = ready
        for listener in self._listeners:
            listener(upstream, ready)

    async def close(self) -> None:
        started, self._started = self._started, []
        await asyncio.gather(*(discovery.close() for discovery in started), return_exceptions=True)
