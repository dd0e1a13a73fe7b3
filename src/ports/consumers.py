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
    """A request's token estimate, reserved once its body is decoded; `settle` replaces it
    with what was used."""

    snapshot: RateSnapshot  # the consumer's limits after this reservation (response headers)

    async def settle(self, tokens_used: int) -> None:
        """Charge `tokens_used` (prompt + completion) instead of the estimate; idempotent."""
        ...


class UsageLedger(Protocol):
    """Request and token counters per consumer: one process (memory) or shared (Redis).

    A request is decided in two atomic steps (`domain.rate_limits`): `take_request` before
    its body is read (one request of `requests_per_minute`), `reserve_tokens` once it is
    decoded (its estimate in every token limit, or in none). Over a limit each raises
    `RateLimited` (with Retry-After: when the request would fit); when a shared backend
    cannot be reached it raises `AdmissionUnavailable` (fail closed). A consumer without
    the limits a step checks passes it without touching the backend.
    """

    async def take_request(self, consumer: Consumer) -> RateSnapshot:
        """Charge one request; the consumer's limits after it (EMPTY_SNAPSHOT: no request limit)."""
        ...

    async def reserve_tokens(self, consumer: Consumer, tokens: int) -> Reservation: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class ConsumerSlot(Protocol):
    async def release(self) -> None:
        """Idempotent; safe from `finally`."""
        ...


class ConsumerConcurrency(Protocol):
    """`max_in_flight` per consumer, across every upstream (and every process, on Redis)."""

    async def acquire(self, consumer: Consumer, timeout: float, max_waiting: int) -> ConsumerSlot:
        """Wait up to `timeout` seconds for one of the consumer's slots (immediately when it
        has no `max_in_flight`). Raises `QueueTimeout` when the wait runs out, and
        `RateLimited` (`LimitKind.MAX_IN_FLIGHT`) at once when it would wait while
        `max_waiting` of the consumer's requests already do (in this process); cancelling the
        wait leaves no trace (a slot granted in that same instant is given back)."""
        ...

    async def start(self) -> None:
        """Begin what a shared backend runs in the background (lease renewal, wake-ups)."""
        ...

    async def close(self) -> None:
        """Stop it and give back the slots this process still holds."""
        ...
