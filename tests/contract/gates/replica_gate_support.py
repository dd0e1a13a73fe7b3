"""The `make_gate` fixture of the contracts that hold k sequence slots per request and
replicas (test_gate_sequences.py, test_gate_health.py, test_gate_reclaim.py), and their
helpers: one gate per call, in memory or on Redis (single server or cluster; on Redis
every call is another "process", with its own connections).

The Redis variants need the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0) and FAIL when it is unreachable.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest
from tests.contract.gates.test_gate_contract import REDIS_URL, delete_prefix, redis_target, require_redis

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.redis_gate import RedisAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy

A, B, C = "http://127.0.0.2:8080", "http://127.0.0.3:8080", "http://127.0.0.4:8080"
MakeGate = Callable[..., Awaitable[Any]]


def policy(cap: int = 4, depth: int = 8, timeout: float = 10.0, fairness: str = "fifo") -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout, fairness=fairness)


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


async def granted(entry: Any, timeout: float = 2.0) -> Any:
    lease = entry if not entry.queued else await entry.wait(timeout)
    assert lease is not None, "not granted in time"
    return lease


async def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def counts(gate: Any, upstream: str = "up") -> dict[str, int]:
    return {r.address: r.in_flight for r in gate.replicas(upstream)}
