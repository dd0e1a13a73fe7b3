"""`[endpoints] urls`: a fixed set of replicas, every one always ready."""

from __future__ import annotations

from collections.abc import Iterable

from ports.discovery import ReadyListener


class StaticReplicas:
    __slots__ = ("_ready",)

    def __init__(self, urls: Iterable[str]) -> None:
        self._ready = frozenset(urls)

    async def start(self, listener: ReadyListener) -> None:
        listener(self._ready)

    def ready(self) -> frozenset[str]:
        return self._ready

    async def close(self) -> None:
        return None
