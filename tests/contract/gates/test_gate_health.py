"""Ejected and saturated replicas, affinity at arrival and the one safe retry's lease move
on both admission backends: one contract for the in-memory and the Redis gate (single
server and cluster, the `make_gate` fixture of replica_gate_support.py: on Redis every
call is another "process", with its own connections), then what only a shared ledger can
show: two processes, one move.

The Redis variants need the Redis at GATEWAY_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0) and FAIL when it is unreachable. Real time, short timeouts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from tests.contract.gates import replica_gate_support
from tests.contract.gates.replica_gate_support import A, B, C, MakeGate, counts, eventually, granted, policy

from domain.errors import AdmissionUnavailable
from domain.replicas import ReplicaState

make_gate = replica_gate_support.make_gate  # the fixture (memory, redis, cluster), used here too


def states(gate: Any, upstream: str = "up") -> dict[str, ReplicaState]:
    return {r.address: r.state for r in gate.replicas(upstream)}


def saturated(gate: Any, upstream: str = "up") -> dict[str, bool]:
    return {r.address: r.saturated for r in gate.replicas(upstream)}


async def settle(gate: Any) -> None:
    """Let a Redis gate's scheduled wake-up (`set_*`'s maintain call) finish; no-op in memory."""
    tasks = list(getattr(gate, "_tasks", ()))
    if tasks:
        await asyncio.wait(tasks, timeout=2.0)


# A Redis gate whose only wake-ups are the pub/sub grants (no refresher round, no poll
# before 30 s): a waiter granted in time was promoted by the very call under test.
NO_FALLBACK = {"refresh_seconds": 3600.0, "recheck_seconds": 30.0}


async def ready(
    make_gate: MakeGate, cap: int, limit: int, replicas: list[str], depth: int = 8, **kw: Any,
) -> Any:
    gate = await make_gate({"up": policy(cap=cap, depth=depth)}, {"up": limit}, **kw)
    gate.set_replicas("up", replicas)
    await settle(gate)
    return gate


async def release_all(gate: Any, *entries: Any) -> None:
    """End every entry (of any process), then `gate` sees the upstream empty."""
    for entry in entries:
        await (entry.cancel() if entry.queued else entry.release())
    await eventually(lambda: gate.snapshot("up").in_use == 0 and gate.snapshot("up").queued == 0)


# -- ejected ---------------------------------------------------------------------------------


async def test_an_ejected_replica_gets_nothing_new_and_leaves_the_live_cap(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=4, limit=2, replicas=[A, B], **NO_FALLBACK)
    gate.set_ejected("up", [B])
    await settle(gate)
    first = await gate.enter("up", prefer=[B], max_extra=5)
    assert not first.queued and first.replica == A  # B is ejected: the preference cannot win
    assert states(gate) == {A: ReplicaState.READY, B: ReplicaState.EJECTED}  # not DRAINING
    second = await gate.enter("up")
    assert not second.queued and second.replica == A
    waiting = await gate.enter("up")
    assert waiting.queued  # the live cap is A's 2 (the cap 4 counts B's 2 only while eligible)
    assert counts(gate) == {A: 2, B: 0} and gate.snapshot("up").in_use == 2
    waiter = asyncio.create_task(waiting.wait(3.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    gate.set_ejected("up", [])  # B returns: the queued request goes in at once, to B
    lease = await asyncio.wait_for(waiter, 1.5)
    assert lease is not None and lease.replica == B
    assert states(gate) == {A: ReplicaState.READY, B: ReplicaState.READY}
    await release_all(gate, first, second, lease)


async def test_an_ejected_replica_keeps_its_requests_and_the_set_survives_discovery(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=6, limit=2, replicas=[A, B])
    on_a = await gate.enter("up")
    on_b = await gate.enter("up")
    assert (on_a.replica, on_b.replica) == (A, B)
    gate.set_ejected("up", [B])
    gate.set_replicas("up", [A, B, C])  # a new discovery answer: B stays ejected
    await settle(gate)
    await eventually(lambda: counts(gate) == {A: 1, B: 1, C: 0})
    assert states(gate) == {A: ReplicaState.READY, B: ReplicaState.EJECTED, C: ReplicaState.READY}
    more = [await gate.enter("up") for _ in range(3)]  # live cap 4 (A, C): 2 + 1 + B's 1 held
    assert [m.queued for m in more] == [False, False, True]
    assert sorted(m.replica for m in more[:2]) == [A, C] and all(m.replica != B for m in more[:2])
    await on_b.release()  # B's request finishes: the room is in the live cap, not on B
    lease = await granted(more[2])
    assert lease.replica == C
    await release_all(gate, on_a, *more[:2], lease)


# -- saturated -------------------------------------------------------------------------------


async def test_a_saturated_replica_gets_nothing_new_but_keeps_its_slots_in_the_cap(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], **NO_FALLBACK)
    gate.set_saturated("up", [A])
    await settle(gate)
    assert saturated(gate) == {A: True, B: False, C: False}
    assert states(gate) == {A: ReplicaState.READY, B: ReplicaState.READY, C: ReplicaState.READY}
    leases = [await gate.enter("up", prefer=[A], max_extra=5) for _ in range(4)]
    assert all(not one.queued for one in leases) and sorted(one.replica for one in leases) == [B, B, C, C]
    waiting = await gate.enter("up")
    assert waiting.queued  # 4 + 1 <= the cap of 6 (A's slots still count), but only A has room
    waiter = asyncio.create_task(waiting.wait(3.0))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    gate.set_saturated("up", [])
    lease = await asyncio.wait_for(waiter, 1.5)
    assert lease is not None and lease.replica == A
    await release_all(gate, *leases, lease)


async def test_replica_health_needs_replicas(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2)})
    for call in (gate.set_ejected, gate.set_saturated):
        with pytest.raises(KeyError):
            call("up", [A])


# -- affinity at arrival -----------------------------------------------------------------------


async def test_prefer_wins_at_arrival_within_max_extra_of_the_least_loaded(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=8, limit=4, replicas=[A, B, C])
    first = await gate.enter("up", prefer=[C])
    assert first.replica == C  # all at 0: C is within 0 of the least
    second = await gate.enter("up", prefer=[C])
    assert second.replica == A  # C holds 1, the least 0: not within max_extra 0 (round robin after C)
    third = await gate.enter("up", prefer=[C], max_extra=1)
    assert third.replica == C  # within 1 of the least loaded (B: 0)
    fourth = await gate.enter("up", prefer=["http://nowhere:1", B, C], max_extra=1)
    assert fourth.replica == B  # the first preferred replica that qualifies; unknown ones are skipped
    await eventually(lambda: counts(gate) == {A: 1, B: 1, C: 2})
    await release_all(gate, first, second, third, fourth)


async def test_a_request_admitted_later_from_the_queue_goes_to_the_least_loaded(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=3, limit=2, replicas=[A, B, C])
    held = [await gate.enter("up") for _ in range(3)]
    assert [one.replica for one in held] == [A, B, C]
    waiting = await gate.enter("up", prefer=[C], max_extra=5)
    assert waiting.queued  # the cap of 3
    await held[0].release()  # A: 0, B: 1, C: 1; at arrival C would have won
    lease = await granted(waiting)
    assert lease.replica == A
    await release_all(gate, *held[1:], lease)


# -- the one safe retry's move -----------------------------------------------------------------


async def test_a_move_goes_to_another_replica_with_room_and_keeps_the_count(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=4, limit=2, replicas=[A, B])
    one, two, three = [await gate.enter("up") for _ in range(3)]
    assert [one.replica, two.replica, three.replica] == [A, B, A]
    assert await one.move() == B
    assert one.replica == B
    await eventually(lambda: counts(gate) == {A: 1, B: 2})
    assert gate.snapshot("up").in_use == 3
    assert await three.move() is None  # B is full, A is its own: nothing changes
    assert three.replica == A
    await eventually(lambda: counts(gate) == {A: 1, B: 2})
    assert gate.snapshot("up").in_use == 3
    big = await gate.enter("up", slots=2)
    assert big.queued  # 3 + 2 > the cap: queued
    await one.release()  # the moved lease gives back B's slot, not A's
    await eventually(lambda: counts(gate) == {A: 1, B: 1})
    await release_all(gate, two, three, big)


async def test_a_move_takes_all_k_slots_and_needs_k_free_on_one_replica(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=8, limit=3, replicas=[A, B, C])
    pair = await gate.enter("up", slots=2)
    assert (pair.slots, pair.replica) == (2, A)
    fillers = [await gate.enter("up", prefer=[r], max_extra=9) for r in (B, B, C)]  # B 2, C 1
    assert [f.replica for f in fillers] == [B, B, C]
    assert await pair.move() == C  # B has 1 free: only C has 2
    await eventually(lambda: counts(gate) == {A: 0, B: 2, C: 3})
    assert gate.snapshot("up").in_use == 5
    assert await pair.move() == A  # back: A has 3 free, B 1
    await eventually(lambda: counts(gate) == {A: 2, B: 2, C: 1})
    await release_all(gate, pair, *fillers)


async def test_a_move_never_goes_to_an_ejected_or_saturated_replica(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C])
    lease = await gate.enter("up", prefer=[A])
    assert lease.replica == A
    gate.set_ejected("up", [B])
    gate.set_saturated("up", [C])
    await settle(gate)
    assert await lease.move() is None
    assert lease.replica == A and counts(gate) == {A: 1, B: 0, C: 0}
    gate.set_saturated("up", [])
    await settle(gate)
    assert await lease.move() == C
    await eventually(lambda: counts(gate) == {A: 0, B: 0, C: 1})
    gate.set_ejected("up", [C])  # a lease on an ejected replica moves off it (the retry's case)
    gate.set_replicas("up", [A, C])  # B gone, C ejected: A is the only eligible one
    await settle(gate)
    assert await lease.move() == A
    await eventually(lambda: counts(gate) == {A: 1, C: 0})
    await release_all(gate, lease)


async def test_the_room_a_move_leaves_admits_a_queued_k_request(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], **NO_FALLBACK)
    on = {r: await gate.enter("up", prefer=[r], max_extra=1) for r in (A, B, C)}
    extra = await gate.enter("up", prefer=[A], max_extra=1)  # A 2, B 1, C 1
    assert [on[A].replica, on[B].replica, on[C].replica, extra.replica] == [A, B, C, A]
    waiting = await gate.enter("up", slots=2)  # 4 + 2 fits the cap, but no replica has 2 free
    assert waiting.queued
    waiter = asyncio.create_task(waiting.wait(3.0))
    await asyncio.sleep(0.05)
    assert await on[B].move() == C  # B is empty now: the queued 2-request goes there
    lease = await asyncio.wait_for(waiter, 1.5)
    assert lease is not None and (lease.slots, lease.replica) == (2, B)
    await eventually(lambda: counts(gate) == {A: 2, B: 2, C: 2} and gate.snapshot("up").in_use == 6)
    await release_all(gate, *on.values(), extra, lease)


async def test_nothing_to_move_without_replicas_or_once_released(make_gate: MakeGate) -> None:
    gate = await make_gate({"plain": policy(cap=2), "free": None, "up": policy(cap=4)}, {"up": 2})
    plain = await gate.enter("plain")
    free = await gate.enter("free")
    assert await plain.move() is None and plain.replica is None
    assert await free.move() is None
    gate.set_replicas("up", [A, B])
    await settle(gate)
    lease = await gate.enter("up")
    await lease.release()
    assert await lease.move() is None  # released: nothing to move
    await eventually(lambda: counts(gate) == {A: 0, B: 0})
    await plain.release()
    await free.release()


# -- Redis only: two processes, the move's idempotence, Redis down ------------------------------


# the fixture's Redis kinds only (one process's gate has no second process to share with)
redis_only = pytest.mark.parametrize("make_gate", ["redis", "cluster"], indirect=True)


@redis_only
async def test_two_processes_see_one_move_and_keep_their_own_health_views(make_gate: MakeGate) -> None:
    a = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], depth=16)
    b = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], depth=16)
    mine = await a.enter("up", prefer=[A])
    theirs = await b.enter("up", prefer=[A], max_extra=1)
    assert (mine.replica, theirs.replica) == (A, A)  # b's pick counts a's request
    a.set_ejected("up", [B])  # a's outlier detection: b's view is its own
    await settle(a)
    assert states(a)[B] is ReplicaState.EJECTED and states(b)[B] is ReplicaState.READY
    assert await mine.move() == C  # a never moves to B, which it ejected
    await eventually(lambda: counts(b) == {A: 1, B: 0, C: 1})  # b sees a's move (its refresher reads it)
    assert b.snapshot("up").in_use == 2
    on_b = await b.enter("up", prefer=[B])
    assert on_b.replica == B  # b still sends to B
    filler = await a.enter("up")
    assert filler.replica == C  # a: A or C (1 each), the first after B, picked last (by b)
    big = await b.enter("up", slots=2)  # A 1, B 1, C 2: no replica has 2 free
    assert big.queued
    assert await theirs.move() == B  # b's view: B has room (C is full); A is left empty...
    lease = await granted(big)  # ... and takes the queued 2-request
    assert (lease.slots, lease.replica) == (2, A)
    await eventually(lambda: counts(a) == {A: 2, B: 2, C: 2} and a.snapshot("up").in_use == 6)
    await release_all(a, mine, filler, theirs, on_b, lease)


@redis_only
async def test_two_processes_move_and_promote_across_processes(make_gate: MakeGate) -> None:
    a = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], depth=16, **NO_FALLBACK)
    b = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C], depth=16, **NO_FALLBACK)
    on_a = await a.enter("up", prefer=[A])
    on_b = await b.enter("up", prefer=[B])
    on_c = await a.enter("up", prefer=[C])
    extra = await b.enter("up", prefer=[A], max_extra=1)  # A 2, B 1, C 1 over two processes
    assert [on_a.replica, on_b.replica, on_c.replica, extra.replica] == [A, B, C, A]
    waiting = await a.enter("up", slots=2)
    assert waiting.queued
    waiter = asyncio.create_task(waiting.wait(3.0))
    await asyncio.sleep(0.05)
    assert await on_b.move() == C  # b's move frees B: a's queued 2-request is promoted there
    lease = await asyncio.wait_for(waiter, 1.5)  # published by b's move script, heard by a
    assert lease is not None and (lease.slots, lease.replica) == (2, B)
    assert counts(b) == {A: 2, B: 2, C: 2} and b.snapshot("up").in_use == 6  # the move's own reply
    await a._call(a._ups["up"], "maintain", a._owner)  # a heard only the grant: fresh counts
    assert counts(a) == {A: 2, B: 2, C: 2} and a.snapshot("up").in_use == 6
    await release_all(a, on_a, on_c, lease, on_b, extra)


@redis_only
async def test_the_move_script_is_idempotent_per_token_and_source(make_gate: MakeGate) -> None:
    """A retried call (redis-py retries once after a dropped connection) must not move twice."""
    gate = await ready(make_gate, cap=6, limit=2, replicas=[A, B, C])
    lease = await gate.enter("up")
    assert lease.replica == A
    up = gate._ups["up"]
    first = await gate._call(up, "move", gate._owner, lease.token, A)
    again = await gate._call(up, "move", gate._owner, lease.token, A)  # the reply of the first was "lost"
    assert first == again == (1, 0, B)
    await eventually(lambda: counts(gate) == {A: 0, B: 1, C: 0})
    assert await lease.move() == B  # the lease still names A: the answer is where it is, nothing moves
    assert lease.replica == B
    await eventually(lambda: counts(gate) == {A: 0, B: 1, C: 0})
    assert await lease.move() == C  # from B now: A and C have room, C comes after B
    await eventually(lambda: counts(gate) == {A: 0, B: 0, C: 1})
    await release_all(gate, lease)
    assert counts(gate) == {A: 0, B: 0, C: 0}


@redis_only
async def test_a_move_with_redis_unreachable_is_admission_unavailable(make_gate: MakeGate) -> None:
    gate = await ready(make_gate, cap=4, limit=2, replicas=[A, B])
    lease = await gate.enter("up")
    script = gate._scripts["move"]

    async def down(*_: Any, **__: Any) -> Any:
        raise RedisConnectionError("Redis is down")

    gate._scripts["move"] = down
    try:
        with pytest.raises(AdmissionUnavailable):
            await lease.move()
    finally:
        gate._scripts["move"] = script
    assert lease.replica == A and gate.counters("up")["unavailable"] == 1
    assert await lease.move() == B
    await release_all(gate, lease)
