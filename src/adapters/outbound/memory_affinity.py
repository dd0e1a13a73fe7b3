"""`ports.affinity.AffinityStore` in this process: one `domain.affinity.AffinityMemory` per
upstream (bounded: `capacity` entries, about 80 bytes each, and `ttl_seconds`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from domain.affinity import DEFAULT_CAPACITY, DEFAULT_TTL_SECONDS, AffinityMemory


class MemoryAffinityStore:
    __slots__ = ("_capacity", "_clock", "_memories", "_ttl")

    def __init__(self, capacity: int = DEFAULT_CAPACITY, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._capacity, self._ttl, self._clock = capacity, ttl_seconds, clock
        self._memories: dict[str, AffinityMemory] = {}  # one per upstream (config names: few)

    async def lookup(self, upstream: str, chain: Sequence[int]) -> list[str]:
        memory = self._memories.get(upstream)
        return [] if memory is None or not chain else memory.lookup(chain, self._clock())

    async def record(self, upstream: str, chain: Sequence[int], replica: str) -> None:
        if not chain:
            return
        memory = self._memories.get(upstream)
        if memory is None:
            memory = self._memories[upstream] = AffinityMemory(self._capacity, self._ttl)
        memory.record(chain, replica, self._clock())

    async def close(self) -> None:
        self._memories.clear()
