"""The in-process gate with k slots per request and with replicas."""

from __future__ import annotations

import asyncio

import pytest

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy
from domain.errors import QueueTimeout, TooManySequences
from domain.replicas import ReplicaState
from ports.admission import AdmissionGate

A, B = "http://127.0.0.2:8080", "http://127.0.0.3:8080"


def gate(cap: int = 4, depth: int = 8, timeout: float = 30.0, limits: dict[str, int] | None = None,
         ) -> InMemoryAdmissionGate:
    policy = AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout)
    return InMemoryAdmissionGate({"up": policy, "free": None}, SystemClock(), replica_limits=limits)


def test_satisfies_the_port() -> None:
    port: AdmissionGate = gate(limits={"up": 2})
    assert port.replicas("free") == [] and port.replicas("up") == []


async def test_a_lease_holds_k_slots_and_gives_all_back() -> None:
    g = gate(cap=4)
    lease = await g.enter("up", slots=3)
    assert not lease.queued and (lease.slots, lease.replica) == (3, None)
    assert g.snapshot("up").in_use == 3
    waiting = await g.enter("up", slots=2)
    assert waiting.queued
    await lease.release()
    await lease.release()  # idempotent: the 3 slots came back once
    granted = await waiting.wait(1.0)
    assert granted is not None and granted.slots == 2
    assert g.snapshot("up").in_use == 2
    await granted.release()
    assert g.snapshot("up").in_use == 0 and await g.wait_idle(0.1)
    free = await g.enter("free", slots=5)  # uncapped: no limit, counted in slots
    assert (free.slots, free.replica) == (5, None) and g.snapshot("free").in_use == 5
    await free.release()
    assert g.snapshot("free").in_use == 0


async def test_more_than_the_cap_is_refused_before_anything_is_taken() -> None:
    g = gate(cap=6, limits={"up": 4})
    with pytest.raises(TooManySequences, match="needs 8 sequence slots, more than the 6"):
        await g.enter("up", slots=8)
    with pytest.raises(TooManySequences, match="needs 5 sequence slots, more than the 4"):
        await g.enter("up", slots=5)
    assert g.snapshot("up").in_use == 0 and g.snapshot("up").queued == 0
    assert g.counters("up")["admitted"] == 0


async def test_a_k_request_waits_in_its_place_and_is_not_overtaken() -> None:
    g = gate(cap=4)
    held = [await g.enter("up") for _ in range(3)]
    big = await g.enter("up", slots=3)
    small = await g.enter("up")
    assert big.queued and small.queued and small.position() == 2
    await held[0].release()
    assert await small.wait(0) is None and await big.wait(0) is None  # 2 free: nobody passes the head
    await held[1].release()
    lease = await big.wait(1.0)
    assert lease is not None and lease.slots == 3
    assert await small.wait(0) is None
    await held[2].release()
    small_lease = await small.wait(1.0)
    assert small_lease is not None
    for one in (lease, small_lease):
        await one.release()


async def test_a_blocked_head_leaving_wakes_the_next_waiter() -> None:
    g = gate(cap=2, timeout=0.3)
    held = await g.enter("up")
    big = await g.enter("up", slots=2)
    small = await g.enter("up")
    waiter = asyncio.create_task(small.wait(5.0))
    await asyncio.sleep(0.02)
    await big.cancel()  # the head hangs up: one slot is free for the 1-request behind it
    lease = await asyncio.wait_for(waiter, 1.0)
    assert lease is not None
    await lease.release()
    # the same when the head's queue deadline passes while the next one sleeps
    big = await g.enter("up", slots=2)
    await asyncio.sleep(0.1)
    small = await g.enter("up")
    waiter = asyncio.create_task(small.wait(5.0))
    with pytest.raises(QueueTimeout):
        await big.wait(5.0)
    lease = await asyncio.wait_for(waiter, 1.0)
    assert lease is not None
    for one in (lease, held):
        await one.release()


async def test_replicas_queue_until_discovery_then_bind_round_robin() -> None:
    g = gate(cap=6, limits={"up": 4})
    first = await g.enter("up")
    assert first.queued  # no replica is ready yet
    waiter = asyncio.create_task(first.wait(5.0))
    await asyncio.sleep(0.01)
    g.set_replicas("up", [A, B])  # capacity appears: the waiter is admitted at once
    lease = await asyncio.wait_for(waiter, 1.0)
    assert lease is not None and lease.replica == A
    leases = [lease] + [await g.enter("up") for _ in range(5)]
    assert [one.replica for one in leases] == [A, B, A, B, A, B]
    assert (await g.enter("up")).queued  # the admission cap of 6
    assert {r.address: r.in_flight for r in g.replicas("up")} == {A: 3, B: 3}
    for one in leases:
        await one.release()


async def test_a_draining_replica_finishes_gets_nothing_and_is_forgotten() -> None:
    g = gate(cap=8, limits={"up": 3})
    g.set_replicas("up", [A, B])
    on_a, on_b = await g.enter("up"), await g.enter("up")
    assert (on_a.replica, on_b.replica) == (A, B)
    g.set_replicas("up", [B])
    assert [(r.address, r.state) for r in g.replicas("up")] == [(A, ReplicaState.DRAINING), (B, ReplicaState.READY)]
    assert (await g.enter("up")).replica == B
    assert (await g.enter("up")).queued  # live cap = B's 3, and 3 are in flight
    await on_a.release()
    assert [r.address for r in g.replicas("up")] == [B]
    with pytest.raises(KeyError):
        g.set_replicas("free", [A])


async def test_k_slots_need_k_free_on_one_replica() -> None:
    g = gate(cap=8, limits={"up": 4})
    g.set_replicas("up", [A, B])
    ones = [await g.enter("up") for _ in range(6)]  # 3 + 3
    big = await g.enter("up", slots=2)
    assert big.queued
    await ones[0].release()  # A: 2 in flight, 2 free
    lease = await big.wait(1.0)
    assert lease is not None and (lease.slots, lease.replica) == (2, A)
    assert {r.address: r.in_flight for r in g.replicas("up")} == {A: 4, B: 3}
    for one in [*ones[1:], lease]:
        await one.release()
    assert {r.address: r.in_flight for r in g.replicas("up")} == {A: 0, B: 0}


def test_replica_limits_for_an_unknown_or_uncapped_upstream_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        gate(limits={"nope": 2})
    with pytest.raises(ValueError, match="no admission policy"):
        gate(limits={"free": 2})


async def test_ejected_saturated_affinity_and_the_move_through_the_gate() -> None:
    g = gate(cap=4, limits={"up": 2})
    g.set_replicas("up", [A, B])
    g.set_ejected("up", [B])
    first = await g.enter("up", prefer=[B])
    assert not first.queued and first.replica == A  # B is ejected: the preference cannot win
    assert [r.state for r in g.replicas("up")] == [ReplicaState.READY, ReplicaState.EJECTED]
    await g.enter("up")
    waiting = await g.enter("up")
    assert waiting.queued  # the live cap is A's 2
    g.set_ejected("up", [])
    granted = await waiting.wait(1.0)
    assert granted is not None and granted.replica == B
    g.set_saturated("up", [B])
    assert await first.move() is None  # B has room but says it is full
    g.set_saturated("up", [])
    assert await first.move() == B and first.replica == B
    assert {r.address: r.in_flight for r in g.replicas("up")} == {A: 1, B: 2}
    await first.release()
    assert await first.move() is None  # released: nothing to move
