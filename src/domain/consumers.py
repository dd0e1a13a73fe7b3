"""Consumers: who a request is for, what they may use, and their rate-limit state (pure).

A consumer is a named holder of API keys (`[consumers.NAME]` in the keys file). With
authentication off every request belongs to `ANONYMOUS`, which has no limits. Only
SHA-256 digests of keys are ever stored or compared (`key_digest`); a key carries a
short key id that is not secret, so logs and traces can name the key without it.

Rate-limit decisions are made by a usage ledger (a port: one process or Redis); what it
answers is a `RateState` per limit kind, which each dialect renders as its own headers.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re

import msgspec

DIGEST_PREFIX = "sha256:"
# gw_<key id: 8 hex>_<secret: 43 base64url chars = 256 bits>
_KEY_FORMAT = re.compile(r"gw_([0-9a-f]{8})_[A-Za-z0-9_-]{43}")


class ConsumerLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Every limit is optional; None = unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion tokens
    tokens_per_day: int | None = None  # UTC day
    max_in_flight: int | None = None  # admitted requests of this consumer, all upstreams together

    @property
    def rate_limited(self) -> bool:
        """Whether any request or token limit applies (max_in_flight is a concurrency limit)."""
        return (self.requests_per_minute, self.tokens_per_minute, self.tokens_per_day) != (None, None, None)

    @property
    def token_limited(self) -> bool:
        """Whether a token limit applies (decided once the body is decoded)."""
        return self.tokens_per_minute is not None or self.tokens_per_day is not None

    @property
    def unlimited(self) -> bool:
        return not self.rate_limited and self.max_in_flight is None


class Consumer(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    limits: ConsumerLimits = ConsumerLimits()
    # Queue order under `fairness = "fair"` (domain.admission.fair_order): a higher priority is
    # admitted first; within one priority, a weight-3 consumer gets 3 slots for each of a weight-1 one.
    priority: int = 0
    weight: int = 1  # >= 1
    # vLLM's prefix-cache salt for this consumer's requests (`domain.cache_salt`), set by the
    # credential store; None (the anonymous consumer): no salt.
    cache_salt: str | None = msgspec.field(default=None)


ANONYMOUS = Consumer(name="anonymous")


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated request's consumer and the (non-secret) id of the key it used."""

    consumer: Consumer
    key_id: str | None = None  # None: a key not in gateway format (or auth off)


ANONYMOUS_IDENTITY = Identity(consumer=ANONYMOUS)


def key_digest(key: str) -> str:
    """`sha256:<hex>` of the whole key, as the keys file stores it."""
    return DIGEST_PREFIX + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_id(key: str) -> str | None:
    """The key id of a gateway-format key (`gw_<id>_<secret>`), else None."""
    match = _KEY_FORMAT.fullmatch(key)
    return match.group(1) if match else None


def same_digest(a: str, b: str) -> bool:
    """Constant-time comparison of two digests."""
    return hmac.compare_digest(a.encode(), b.encode())


class LimitKind(enum.Enum):
    """The limits a request can be refused for (the `limit` label of the 429 metric)."""

    REQUESTS_PER_MINUTE = "requests_per_minute"
    TOKENS_PER_MINUTE = "tokens_per_minute"
    TOKENS_PER_DAY = "tokens_per_day"
    # `max_in_flight` taken, and `[auth] max_waiting_per_consumer` requests already waiting
    MAX_IN_FLIGHT = "max_in_flight"


class RateState(msgspec.Struct, frozen=True, kw_only=True):
    """One limit as clients see it: its size, what is left now, and when it is full again.

    `reset_seconds` is from now until the limit is fully replenished (a per-minute bucket)
    or the window restarts (the UTC day), as a float; dialects format it.
    """

    kind: LimitKind
    limit: int
    remaining: int
    reset_seconds: float


class RateSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a request's answer reports: the request limit and the token limit that apply
    (the per-minute one if set, else the per-day one); None where the consumer has none."""

    requests: RateState | None = None
    tokens: RateState | None = None


EMPTY_SNAPSHOT = RateSnapshot()
