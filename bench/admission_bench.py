"""Admission hot-path figures (a script, not a test; runs in a few seconds).

.venv/bin/python bench/admission_bench.py
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy

N = 10_000  # queued waiters for the position and memory figures
rows: list[tuple[str, str]] = []


def policy(cap: int, depth: int) -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=1e6)


def per_second(label: str, cycles: int, seconds: float) -> None:
    rows.append((label, f"{cycles / seconds:,.0f} /s  ({seconds / cycles * 1e6:.2f} us each)"))


def bench_ledger() -> None:
    led, n = SlotLedger(policy(6, 8)), 300_000
    t0 = time.perf_counter()
    for i in range(n):
        led.release(led.arrive(i).ticket, i)
    per_second("ledger arrive+release (free slot)", n, time.perf_counter() - t0)

    led = SlotLedger(policy(1, 8))
    holder = led.arrive(0).ticket
    t0 = time.perf_counter()
    for i in range(n):
        queued = led.arrive(i).ticket  # queue, then promote it by releasing the holder
        led.release(holder, i)
        holder = queued
    per_second("ledger arrive->queue->promote", n, time.perf_counter() - t0)


async def bench_gate() -> None:
    gate, n = InMemoryAdmissionGate({"r": policy(6, 8), "u": None}, SystemClock()), 200_000
    for upstream, label in (("r", "gate enter+release (capped)"), ("u", "gate enter+release (uncapped)")):
        t0 = time.perf_counter()
        for _ in range(n):
            lease = await gate.enter(upstream)
            await lease.release()  # type: ignore[union-attr]
        per_second(label, n, time.perf_counter() - t0)

    # contention: 64 tasks on 8 slots, each holding its slot for one loop turn
    gate = InMemoryAdmissionGate({"r": policy(8, 1000)}, SystemClock())
    stop = time.perf_counter() + 1.0
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            entry = await gate.enter("r")
            lease = await entry.wait(10) if entry.queued else entry  # type: ignore[union-attr]
            await asyncio.sleep(0)
            await lease.release()  # type: ignore[union-attr]
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(64)))
    c = gate.counters("r")
    per_second("gate enter->queue->grant, 64 tasks/8 slots", done, time.perf_counter() - t0)
    rows.append(("  of which went through the queue", f"{c['queued'] / c['admitted']:.0%}"))


async def bench_position_and_memory() -> None:
    led = SlotLedger(policy(1, N))
    led.arrive(0)
    tickets = [led.arrive(0).ticket for _ in range(N)]
    rng = random.Random(1)
    for t in rng.sample(tickets, N // 2):  # hang-ups in the middle of the queue
        led.cancel(t)
    live = [t for t in tickets if led.is_queued(t)]
    probe = [rng.choice(live) for _ in range(100_000)]
    t0 = time.perf_counter()
    for t in probe:
        led.position(t)
    dt = time.perf_counter() - t0
    rows.append((f"position() with {N:,} queued (half cancelled)", f"{dt / len(probe) * 1e9:,.0f} ns"))

    gate = InMemoryAdmissionGate({"r": policy(1, N)}, SystemClock())
    held = await gate.enter("r")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    queued = [await gate.enter("r") for _ in range(N)]
    after_tickets = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.create_task(t.wait(3600)) for t in queued]  # type: ignore[union-attr]
    await asyncio.sleep(0)
    after_tasks = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    rows.append((f"memory per queued ticket ({N:,})", f"{(after_tickets - base) / N:,.0f} B"))
    rows.append(("  + a task blocked in wait()", f"{(after_tasks - after_tickets) / N:,.0f} B"))
    t0 = time.perf_counter()
    await held.release()  # type: ignore[union-attr]
    for task in tasks:  # drain the whole queue through the gate, FIFO
        lease = await task
        assert lease is not None
        await lease.release()
    per_second(f"drain {N:,} blocked waiters one by one", N, time.perf_counter() - t0)


def main() -> None:
    bench_ledger()
    asyncio.run(bench_gate())
    asyncio.run(bench_position_and_memory())
    width = max(len(label) for label, _ in rows)
    print(f"python {sys.version.split()[0]}")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    main()
