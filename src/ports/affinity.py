"""Where an upstream's requests went, by prompt prefix (`domain.affinity`): one process's
memory, or one shared by every process (Redis)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class AffinityStore(Protocol):
    """Affinity is a preference, never a condition: a store that cannot answer (its backend
    down) finds nothing and drops what it is told, and never raises for it."""

    async def lookup(self, upstream: str, chain: Sequence[int]) -> list[str]:
        """The replicas that served `chain`'s prefixes (`domain.affinity.affinity_chain`, longest
        first), the longest match first, each once; [] when nothing is known."""
        ...

    async def record(self, upstream: str, chain: Sequence[int], replica: str) -> None:
        """`replica` was picked for a request with `chain`."""
        ...

    async def close(self) -> None: ...
