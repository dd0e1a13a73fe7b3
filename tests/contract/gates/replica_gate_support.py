"""Helpers of the contracts that hold k sequence slots per request and replicas
(test_gate_sequences.py, test_gate_health.py, test_gate_reclaim.py, test_gate_differential.py):
replica addresses, a policy, waiting for a grant or a condition, per-replica counts. Their
`make_gate` fixture is redis_support's (memory, Redis, cluster).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tests.contract.gates import redis_support

from domain.admission.policy import AdmissionPolicy

A, B, C = "http://127.0.0.2:8080", "http://127.0.0.3:8080", "http://127.0.0.4:8080"
MakeGate = redis_support.MakeGate
make_gate = redis_support.make_gate  # the fixture (memory, redis, cluster)


def policy(cap: int = 4, depth: int = 8, timeout: float = 10.0, fairness: str = "fifo") -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout, fairness=fairness)


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
