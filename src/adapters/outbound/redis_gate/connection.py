"""The Redis client every Redis-backed adapter uses (admission gate, consumer counters).

Short timeouts: a caller that cannot reach Redis fails closed within about a second
instead of hanging a request. One retry without backoff: the first command after a
Redis restart meets a dead pooled socket and must not fail because of it.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from adapters.outbound.redis_gate.background import REDIS_DOWN

__all__ = ["REDIS_DOWN", "connect"]


def connect(redis_url: str, socket_timeout: float = 2.0) -> Redis:
    return Redis.from_url(
        redis_url, decode_responses=True, socket_timeout=socket_timeout,
        socket_connect_timeout=min(1.0, socket_timeout), retry=Retry(NoBackoff(), 1),
    )
