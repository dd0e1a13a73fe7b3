"""Consumers: who holds which key, and what they have used (request and token limits)."""

from __future__ import annotations

from typing import Protocol

from domain.consumers import Consumer, RateSnapshot


class CredentialStore(Protocol):
    """The consumers of the keys file, reloaded when it changes."""

    def lookup(self, digest: str) -> Consumer | None:
        """The consumer holding the key with this `sha256:` digest (constant-time compared), or None."""
        ...

    async def start(self) -> None:
        """Load (a bad file stops startup) and begin watching for changes."""
        ...

    async def close(self) -> None: ...


class Reservation(Protocol):
    """What a request reserved at admission; `settle` replaces it with what was used."""

    snapshot: RateSnapshot  # the consumer's limits after this reservation (response headers)

    async def settle(self, tokens_used: int) -> None:
        """Charge `tokens_used` (prompt + completion) instead of the estimate; idempotent."""
        ...


class UsageLedger(Protocol):
    """Request and token counters per consumer: one process (memory) or shared (Redis).

    `reserve` checks every limit of the consumer and reserves in one atomic step: one
    request and `tokens` tokens, or nothing. Over a limit it raises `RateLimited`
    (with Retry-After: when the request would fit); when a shared backend cannot be
    reached it raises `AdmissionUnavailable` for a limited consumer (fail closed), while
    an unlimited consumer always passes without touching the backend.
    """

    async def reserve(self, consumer: Consumer, tokens: int) -> Reservation: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class ConsumerSlot(Protocol):
    async def release(self) -> None:
        """Idempotent; safe from `finally`."""
        ...


class ConsumerConcurrency(Protocol):
    """`max_in_flight` per consumer, across every upstream (and every process, on Redis)."""

    async def acquire(self, consumer: Consumer, timeout: float) -> ConsumerSlot:
        """Wait up to `timeout` seconds for one of the consumer's slots (immediately when it
        has no `max_in_flight`). Raises `QueueTimeout` when the wait runs out; cancelling the
        wait leaves no trace (a slot granted in that same instant is given back)."""
        ...

    async def start(self) -> None:
        """Begin what a shared backend runs in the background (lease renewal, wake-ups)."""
        ...

    async def close(self) -> None:
        """Stop it and give back the slots this process still holds."""
        ...
