"""The Redis the gate contracts run on, and the `make_gate` fixture they share: one gate per
call, in memory or on Redis (single server or the session's cluster; on Redis every call is
another "process", with its own connections, and everything it wrote is deleted afterwards).

The Redis variants need the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0) and FAIL when it is unreachable.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from tests.support.redis_cluster import RedisCluster

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.redis_gate import RedisAdmissionGate
from adapters.outbound.redis_gate.connection import RedisTarget
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy

MakeGate = Callable[..., Awaitable[Any]]
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def require_redis(url: str = REDIS_URL) -> None:
    client = Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        await client.ping()
    except Exception as error:
        pytest.fail(f"Redis at {url} is unreachable ({error}); start it with scripts/ensure-redis")
    finally:
        await client.aclose()


async def delete_prefix(prefix: str, url: str = REDIS_URL, cluster: bool = False) -> None:
    client: Any = ClusterClient.from_url(url) if cluster else Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
        for key in keys:  # one by one: on a cluster, keys of several slots
            await client.delete(key)
    finally:
        await client.aclose()


def redis_target(kind: str, request: pytest.FixtureRequest) -> tuple[str | RedisTarget, str]:
    """The Redis of a test variant: the shared one, or the session's cluster (target, URL)."""
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return RedisTarget(url=cluster.url, cluster=True), cluster.url
    return REDIS_URL, REDIS_URL


@pytest.fixture(params=["memory", "redis", "cluster"])
async def make_gate(request: pytest.FixtureRequest) -> AsyncIterator[MakeGate]:
    """`await make_gate(policies, replica_limits)`; on Redis every call is another "process"."""
    kind: str = request.param
    prefix = f"gwtest-{uuid.uuid4().hex[:12]}"
    made: list[RedisAdmissionGate] = []
    target, url = (REDIS_URL, REDIS_URL) if kind == "memory" else redis_target(kind, request)
    if kind != "memory":
        await require_redis(url)

    async def make(policies: Mapping[str, AdmissionPolicy | None], limits: Mapping[str, int] | None = None,
                   **kw: Any) -> Any:
        if kind == "memory":
            return InMemoryAdmissionGate(policies, SystemClock(), replica_limits=limits)
        kw.setdefault("lease_seconds", 5)
        gate = RedisAdmissionGate(policies, SystemClock(), target, key_prefix=prefix, replica_limits=limits, **kw)
        made.append(gate)
        await gate.start()
        return gate

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for gate in made:
        await gate.close()
    if kind != "memory":
        await delete_prefix(prefix, url, cluster=kind == "cluster")
