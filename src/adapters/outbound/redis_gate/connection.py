"""The Redis client every Redis-backed adapter uses (admission gate, consumer counters).

Three deployments (`RedisTarget`, from `[admission]`): one server (`redis_url`), a
Sentinel-managed master (`redis_sentinels` + `redis_sentinel_master`: redis-py's
`Sentinel`, which asks the sentinels for the current master at every (re)connect, so a
failover is followed by itself), or a cluster (`redis_cluster = true`, `redis_url` one of
its nodes: redis-py's `RedisCluster`; every key of one upstream or one consumer carries one
`{...}` hash tag, so each script's keys share a slot).

Short timeouts: a caller that cannot reach Redis fails closed within about a second
instead of hanging a request. One retry without backoff: the first command after a
Redis restart meets a dead pooled socket and must not fail because of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError
from redis.retry import Retry

__all__ = ["REDIS_DOWN", "RedisTarget", "connect", "prepare", "run_scripts"]

Client = Redis | RedisCluster
# Failures that mean "Redis did not answer": fail closed, never crash a request.
REDIS_DOWN: tuple[type[BaseException], ...] = (RedisError, OSError, asyncio.TimeoutError)


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: `url` (one server, or with `cluster` a node of the cluster), or
    `sentinels` ((host, port), ...) and the monitored master's name."""

    url: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str | None = None
    cluster: bool = False

    def __str__(self) -> str:  # for logs: never a password
        if self.sentinels:
            return f"sentinel master '{self.sentinel_master}'"
        return "redis cluster" if self.cluster else "redis"


def connect(target: str | RedisTarget, socket_timeout: float = 2.0) -> Client:
    if isinstance(target, str):
        target = RedisTarget(url=target)
    timeouts: dict[str, Any] = {"socket_timeout": socket_timeout,
                                "socket_connect_timeout": min(1.0, socket_timeout)}
    if target.sentinels:
        assert target.sentinel_master, "a Sentinel target names its master"
        sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=dict(timeouts), **timeouts)  # type: ignore[no-untyped-call]
        client: Client = sentinel.master_for(target.sentinel_master, redis_class=Redis, decode_responses=True,
                                             retry=Retry(NoBackoff(), 1), **timeouts)
        return client
    assert target.url, "a URL target has its URL"
    if target.cluster:
        return RedisCluster.from_url(target.url, decode_responses=True, retry=Retry(NoBackoff(), 1), **timeouts)
    return Redis.from_url(target.url, decode_responses=True, retry=Retry(NoBackoff(), 1), **timeouts)


async def prepare(client: Client) -> None:
    """Before the first concurrent use: a cluster client learns the slot map once (redis-py's
    lazy first initialization is not safe under concurrent first calls). Raises REDIS_DOWN
    errors; the caller carries on without (the client initializes on first use)."""
    if isinstance(client, RedisCluster):
        await client.initialize()


async def run_scripts(client: Client, calls: Sequence[tuple[AsyncScript, Sequence[str], Sequence[Any]]]) -> list[Any]:
    """Several script calls in one round trip (a non-transactional pipeline). On a cluster,
    where redis-py refuses scripts in a pipeline, they run concurrently, each on its keys' node."""
    if isinstance(client, RedisCluster):
        return list(await asyncio.gather(*(script(keys=keys, args=args) for script, keys, args in calls)))
    async with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        return list(await pipe.execute())
