"""Where an upstream's replicas are: the ready ones, as the discovery source says now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

ReadyListener = Callable[[frozenset[str]], None]
"""Told the ready replicas' base URLs (`scheme://host:port`) each time they change."""


class ReplicaDiscovery(Protocol):
    """One upstream's replica source (fixed URLs, DNS records, ...).

    It never runs per request and never blocks the event loop: a source that must look
    replicas up does so in the background, and keeps its last good answer when a look-up
    fails. An empty set means no replica is ready.
    """

    async def start(self, listener: ReadyListener) -> None:
        """Tell `listener` the first answer (before this returns), then every change."""
        ...

    def ready(self) -> frozenset[str]:
        """The last good answer."""
        ...

    async def close(self) -> None: ...
