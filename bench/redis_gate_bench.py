"""Admission cost: the Redis gate against the in-memory gate, on loopback only.

    .venv/bin/python bench/redis_gate_bench.py [--redis-url redis://127.0.0.1:6379/0]
        [--ops 3000] [--seconds 3] [--concurrency 32]

Two measurements per backend, each bounded by an operation count AND a time budget:
- latency: one caller, uncontended, `enter` + `release` per operation (p50/p99, in us);
- throughput: `--concurrency` callers against cap 8 (so most of them queue), each doing
  enter -> wait for the slot -> release; operations per second and p50/p99 of the
  time to a slot. "redis x3" spreads the callers over three gate instances (three
  "processes" with their own connections) sharing one cap and queue.
Keys go under a random prefix and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from redis.asyncio import Redis

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.redis_gate import RedisAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy

POLICY = AdmissionPolicy(max_in_flight=8, queue_depth=1000, queue_timeout_seconds=60)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6 if ordered else float("nan")


async def latency(gate: Any, ops: int, budget: float) -> dict[str, float]:
    samples: list[float] = []
    stop = time.perf_counter() + budget
    while len(samples) < ops and time.perf_counter() < stop:
        started = time.perf_counter()
        lease = await gate.enter("up")
        await lease.release()
        samples.append(time.perf_counter() - started)
    return {"n": len(samples), "p50": pct(samples, 0.5), "p99": pct(samples, 0.99),
            "mean": statistics.fmean(samples) * 1e6}


async def throughput(gates: list[Any], ops: int, budget: float, concurrency: int) -> dict[str, float]:
    waits: list[float] = []
    stop = time.perf_counter() + budget
    done = 0

    async def caller(gate: Any) -> None:
        nonlocal done
        while done < ops and time.perf_counter() < stop:
            started = time.perf_counter()
            entry = await gate.enter("up")
            lease = entry
            while lease.queued:
                lease = await entry.wait(1.0) or entry
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(0)  # "work": let the others run
            await lease.release()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(gates[i % len(gates)]) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"n": done, "ops_s": done / elapsed, "p50": pct(waits, 0.5), "p99": pct(waits, 0.99)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if urlsplit(args.redis_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("loopback Redis only")
    ops, budget = min(args.ops, 20000), min(args.seconds, 10.0)
    prefix = f"gwbench-{uuid.uuid4().hex[:8]}"
    clock = SystemClock()

    def redis_gate() -> RedisAdmissionGate:
        return RedisAdmissionGate({"up": POLICY}, clock, args.redis_url, key_prefix=prefix)

    rows: list[tuple[str, dict[str, float], dict[str, float]]] = []
    memory = InMemoryAdmissionGate({"up": POLICY}, clock)
    rows.append(("memory", await latency(memory, ops, budget),
                 await throughput([memory], ops, budget, args.concurrency)))
    gates = [redis_gate() for _ in range(3)]
    try:
        for gate in gates:
            await gate.start()
        await latency(gates[0], 200, 1.0)  # warm-up: connections, script cache
        rows.append(("redis", await latency(gates[0], ops, budget),
                     await throughput(gates[:1], ops, budget, args.concurrency)))
        rows.append(("redis x3", await latency(gates[1], ops, budget),
                     await throughput(gates, ops, budget, args.concurrency)))
    finally:
        for gate in gates:
            await gate.close()
        client = Redis.from_url(args.redis_url)
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    print(f"enter+release, cap {POLICY.max_in_flight}, {args.concurrency} callers for throughput\n")
    print(f"{'backend':<10} {'lat n':>6} {'p50 us':>9} {'p99 us':>9} | "
          f"{'tput n':>7} {'ops/s':>9} {'slot p50 us':>12} {'slot p99 us':>12}")
    for name, lat, tput in rows:
        print(f"{name:<10} {lat['n']:>6.0f} {lat['p50']:>9.1f} {lat['p99']:>9.1f} | "
              f"{tput['n']:>7.0f} {tput['ops_s']:>9.0f} {tput['p50']:>12.1f} {tput['p99']:>12.1f}")


if __name__ == "__main__":
    asyncio.run(main())
