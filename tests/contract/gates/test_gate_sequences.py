"""k sequence slots per request and per-replica counts: one contract for the in-memory and
the Redis gate (single server and cluster; the `make_gate` fixture of
replica_gate_support.py). Ejected and saturated replicas, affinity and the lease move have
their own contract in test_gate_health.py; what a process that dies, is fenced or closes
gives back is in test_gate_reclaim.py.

The Redis variants need the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0) and FAIL when it is unreachable. Real time, short timeouts.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from tests.contract.gates import replica_gate_support
from tests.contract.gates.replica_gate_support import A, B, MakeGate, counts, eventually, granted, policy

from domain.consumers import Consumer
from domain.errors import QueueTimeout, TooManySequences
from domain.replicas import ReplicaState

make_gate = replica_gate_support.make_gate  # the fixture (memory, redis, cluster)


async def test_k_slots_at_once_in_their_place(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=4)})
    held = [await gate.enter("up") for _ in range(3)]
    big = await gate.enter("up", slots=3)
    small = await gate.enter("up")
    assert big.queued and small.queued and (big.position(), small.position()) == (1, 2)
    await held[0].release()
    assert await big.wait(0) is None and await small.wait(0) is None  # 2 free: the head waits, nobody passes
    await held[1].release()
    lease = await granted(big)
    assert (lease.slots, lease.replica) == (3, None)
    assert await small.wait(0) is None
    await eventually(lambda: gate.snapshot("up").in_use == 4)
    await lease.release()  # all 3 come back: the 1-request goes in
    one = await granted(small)
    await eventually(lambda: gate.snapshot("up").in_use == 2)
    for entry in (one, held[2]):
        await entry.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)


async def test_more_than_the_cap_or_a_replica_is_a_400_before_anything(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=6), "rep": policy(cap=6)}, {"rep": 4})
    with pytest.raises(TooManySequences) as caught:
        await gate.enter("up", slots=8)
    assert caught.value.status == 400 and caught.value.kind == "too_many_sequences"
    assert str(caught.value) == "this request needs 8 sequence slots, more than the 6 this upstream can ever grant"
    with pytest.raises(TooManySequences, match="needs 5 sequence slots, more than the 4"):
        await gate.enter("rep", slots=5)
    assert gate.counters("up")["admitted"] == 0 and gate.snapshot("up").queued == 0


async def test_a_cancelled_k_head_lets_the_next_in_and_gives_nothing_away(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2)})
    held = await gate.enter("up")
    big = await gate.enter("up", slots=2)
    small = await gate.enter("up")
    waiter = asyncio.create_task(small.wait(3.0))
    await asyncio.sleep(0.05)
    await big.cancel()
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None
    await lease.release()
    await held.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)
    both = await gate.enter("up", slots=2)  # nothing leaked: 2 free again
    assert not both.queued
    await both.release()


async def test_replicas_wait_for_discovery_then_spread_round_robin_under_the_live_cap(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=6, depth=8)}, {"up": 4})
    first = await gate.enter("up")
    assert first.queued and gate.replicas("up") == []  # nothing ready: requests queue
    waiter = asyncio.create_task(first.wait(3.0))
    await asyncio.sleep(0.05)
    gate.set_replicas("up", [B, A])
    started = time.monotonic()
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None and lease.replica == A and time.monotonic() - started < 1.0
    leases = [lease] + [await gate.enter("up") for _ in range(5)]
    assert [one.replica for one in leases] == [A, B, A, B, A, B]
    seventh = await gate.enter("up")
    assert seventh.queued  # the cap of 6: 3 + 3 is the seed's cap, though each replica has 1 free
    await eventually(lambda: counts(gate) == {A: 3, B: 3})
    await seventh.cancel()
    for one in leases:
        await one.release()
    await eventually(lambda: counts(gate) == {A: 0, B: 0})


async def test_k_on_one_replica_and_draining(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=8, depth=8)}, {"up": 4})
    gate.set_replicas("up", [A, B])
    await asyncio.sleep(0.05)
    ones = [await granted(await gate.enter("up")) for _ in range(6)]  # A 3, B 3
    big = await gate.enter("up", slots=2)
    assert big.queued  # 6 + 2 <= 8, but no replica has 2 free
    await ones[0].release()  # A: 2 free
    lease = await granted(big)
    assert (lease.slots, lease.replica) == (2, A)
    await eventually(lambda: counts(gate) == {A: 4, B: 3})
    gate.set_replicas("up", [B])  # A drains: its 4 finish, it gets nothing new
    await asyncio.sleep(0.05)
    extra = await gate.enter("up")
    assert extra.queued  # live cap = B's 4, and 7 are in flight
    await eventually(lambda: {r.address: r.state for r in gate.replicas("up")}
                     == {A: ReplicaState.DRAINING, B: ReplicaState.READY})
    await extra.cancel()
    for one in [*[o for o in ones[1:] if o.replica == A], lease]:
        await one.release()
    await eventually(lambda: [r.address for r in gate.replicas("up")] == [B])  # forgotten at 0
    for one in [o for o in ones if o.replica == B]:
        await one.release()


async def test_two_processes_share_the_per_replica_counts(make_gate: MakeGate) -> None:
    if make_gate.kind == "memory":  # type: ignore[attr-defined]
        return  # one process by design: covered above
    a = await make_gate({"up": policy(cap=6, depth=16)}, {"up": 4})
    b = await make_gate({"up": policy(cap=6, depth=16)}, {"up": 4})
    for gate in (a, b):
        gate.set_replicas("up", [A, B])
    await asyncio.sleep(0.05)
    leases = [await granted(await (a if i % 2 else b).enter("up")) for i in range(6)]
    assert sorted(one.replica for one in leases) == [A, A, A, B, B, B]
    waiting = await a.enter("up", slots=2)
    assert waiting.queued
    for one in [o for o in leases if o.replica == B][:2]:
        await one.release()  # b's or a's release frees B's 2: the queued 2-request goes there
    lease = await granted(waiting)
    assert (lease.slots, lease.replica) == (2, B)
    await eventually(lambda: counts(a) == {A: 3, B: 3} and counts(b) == {A: 3, B: 3})
    for one in [*[o for o in leases if o.replica == A], lease, *[o for o in leases if o.replica == B][2:]]:
        await one.release()


@pytest.mark.parametrize("fairness", ["fifo", "fair"])
async def test_the_snapshot_counts_waiters_per_consumer_priority(make_gate: MakeGate, fairness: str) -> None:
    """Both backends report the queue depth per consumer priority."""
    gate = await make_gate({"up": policy(cap=1, depth=8, fairness=fairness)})
    held = await gate.enter("up")
    assert gate.snapshot("up").queued_by_priority is None  # nobody waits
    tickets = [await gate.enter("up", Consumer(name=name, priority=p))
               for name, p in [("a", 0), ("b", 5), ("c", -3), ("d", 5), ("e", 0)]]
    assert all(t.queued for t in tickets)
    assert gate.snapshot("up").queued_by_priority == {0: 2, 5: 2, -3: 1}
    await tickets[1].cancel()
    await tickets[2].cancel()
    await eventually(lambda: gate.snapshot("up").queued_by_priority == {0: 2, 5: 1})
    await held.release()  # fifo: "a" (0) goes in; fair: "d" (5) does
    lease = await granted(tickets[0] if fairness == "fifo" else tickets[3])
    await eventually(lambda: gate.snapshot("up").queued_by_priority
                     == ({0: 1, 5: 1} if fairness == "fifo" else {0: 2}))
    for ticket in tickets:
        await ticket.cancel()
    await lease.release()
    await eventually(lambda: gate.snapshot("up").queued_by_priority is None and gate.snapshot("up").in_use == 0)


async def test_a_k_head_that_times_out_lets_the_next_in(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2, depth=4, timeout=0.5)}, {"up": 2})
    gate.set_replicas("up", [A])
    await asyncio.sleep(0.05)
    held = await granted(await gate.enter("up"))
    big = await gate.enter("up", slots=2)
    await asyncio.sleep(0.25)
    small = await gate.enter("up")
    waiter = asyncio.create_task(small.wait(3.0))
    with pytest.raises(QueueTimeout):
        await big.wait(3.0)
    lease = await asyncio.wait_for(waiter, 3.0)
    assert lease is not None and lease.replica == A
    for one in (lease, held):
        await one.release()
    await eventually(lambda: gate.snapshot("up").in_use == 0)
