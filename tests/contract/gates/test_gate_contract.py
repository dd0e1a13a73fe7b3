"""One contract for every `AdmissionGate` adapter: the in-memory gate and the Redis gate.

Real time, short timeouts. The Redis variant needs the Redis at GATEWAY_TEST_REDIS_URL
(default redis://127.0.0.1:6379/0, `scripts/ensure-redis` starts one): it FAILS when
Redis is unreachable instead of skipping, so CI cannot pass without exercising it. Each
Redis test uses its own key prefix and deletes its keys afterwards. The `cluster` variant
runs the same tests on a 3-master Redis Cluster of its own (`redis_cluster = true`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tests.contract.gates import redis_support

from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from domain.errors import Draining, QueueFull, QueueTimeout
from ports.admission import GateSnapshot

MakeGate = redis_support.MakeGate
make_gate = redis_support.make_gate  # the fixture (memory, redis, cluster)


def policy(cap: int = 1, depth: int = 4, timeout: float = 5.0) -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout)


async def test_grants_at_once_up_to_the_cap(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=3)})
    leases = [await gate.enter("up") for _ in range(3)]
    assert [lease.queued for lease in leases] == [False, False, False]
    assert gate.snapshot("up").in_use == 3
    ticket = await gate.enter("up")
    assert ticket.queued and ticket.position() == 1
    await ticket.cancel()
    for lease in leases:
        await lease.release()
    assert gate.snapshot("up") == GateSnapshot(in_use=0, queued=0, limit=3, queue_limit=4)


async def test_fifo_queue_grants_in_order_and_positions_decrease(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=5)})
    holder = await gate.enter("up")
    tickets = [await gate.enter("up") for _ in range(4)]
    for ticket in tickets:
        assert await ticket.wait(0) is None
    assert [t.position() for t in tickets] == [1, 2, 3, 4]
    assert gate.snapshot("up").queued == 4
    for i, ticket in enumerate(tickets):
        await holder.release()
        holder = await ticket.wait(2.0)
        assert holder is not None and not holder.queued
        rest = tickets[i + 1:]
        for other in rest:  # nobody behind the head was admitted
            assert await other.wait(0) is None
        assert [t.position() for t in rest] == list(range(1, len(rest) + 1))
        assert ticket.position() == 0
    await holder.release()
    assert gate.snapshot("up") == GateSnapshot(in_use=0, queued=0, limit=1, queue_limit=5)
    assert gate.counters("up")["admitted"] == 5 and gate.counters("up")["queued"] == 4


async def test_queue_full_beyond_the_depth(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=2)})
    lease = await gate.enter("up")
    waiting = [await gate.enter("up") for _ in range(2)]
    with pytest.raises(QueueFull) as caught:
        await gate.enter("up")
    assert (caught.value.retry_after or 0) >= 1
    assert gate.counters("up")["rejected_full"] == 1
    assert gate.snapshot("up").queued == 2
    for ticket in waiting:
        await ticket.cancel()
    await lease.release()


async def test_queue_timeout_at_the_deadline(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=2, timeout=0.4)})
    lease = await gate.enter("up")
    ticket = await gate.enter("up")
    assert await ticket.wait(0.05) is None
    started = time.monotonic()
    with pytest.raises(QueueTimeout) as caught:
        await ticket.wait(5.0)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.5, elapsed
    assert (caught.value.retry_after or 0) >= 1
    assert ticket.position() == 0
    assert gate.counters("up")["timed_out"] == 1
    assert gate.snapshot("up").queued == 0
    await ticket.cancel()  # idempotent after the end
    await lease.release()
    assert gate.snapshot("up").in_use == 0


async def test_cancelled_waiters_never_consume_a_slot(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=4)})
    lease = await gate.enter("up")
    first, second = await gate.enter("up"), await gate.enter("up")
    task = asyncio.create_task(first.wait(5.0))
    await asyncio.sleep(0.05)
    task.cancel()  # the client hung up while queued
    with pytest.raises(asyncio.CancelledError):
        await task
    await second.cancel()
    await second.cancel()
    assert gate.snapshot("up").queued == 0
    await lease.release()
    assert gate.snapshot("up").in_use == 0
    fresh = await gate.enter("up")
    assert not fresh.queued
    assert gate.counters("up")["abandoned"] == 2
    await fresh.release()


async def test_cancellation_racing_a_grant_gives_the_slot_back(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=4)})
    lease = await gate.enter("up")
    ticket = await gate.enter("up")
    task = asyncio.create_task(ticket.wait(5.0))
    await asyncio.sleep(0.05)
    releasing = asyncio.create_task(lease.release())  # grants the ticket ...
    await asyncio.sleep(0)
    task.cancel()  # ... in the same instant its requester hangs up
    await releasing
    try:
        won = await task  # the grant may have reached the waiter first: then it is its lease
    except asyncio.CancelledError:
        won = None
    if won is not None:
        await won.release()
    fresh = await gate.enter("up")
    assert not fresh.queued, "the slot leaked to a cancelled waiter"
    assert gate.snapshot("up").in_use == 1
    # granted on the ledger, then cancelled before any wait saw the grant
    for pause in (0.0, 0.05):
        late = await gate.enter("up")
        assert late.queued
        await fresh.release()
        await asyncio.sleep(pause)
        await late.cancel()
        fresh = await gate.enter("up")
        assert not fresh.queued, f"the slot leaked (pause {pause})"
    await fresh.release()
    assert gate.snapshot("up").in_use == 0


async def test_release_is_idempotent(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=2, depth=2)})
    first, second = await gate.enter("up"), await gate.enter("up")
    await first.release()
    await first.release()
    assert gate.snapshot("up").in_use == 1
    third = await gate.enter("up")
    assert not third.queued
    fourth = await gate.enter("up")
    assert fourth.queued  # the double release did not free a second slot
    await fourth.cancel()
    for lease in (second, third):
        await lease.release()
    assert gate.snapshot("up").in_use == 0


async def test_uncapped_upstream_is_unaffected(make_gate: MakeGate) -> None:
    gate = await make_gate({"capped": policy(cap=1, depth=0), "free": None})
    held = await gate.enter("capped")
    with pytest.raises(QueueFull):
        await gate.enter("capped")
    leases = [await gate.enter("free") for _ in range(20)]
    assert not any(lease.queued for lease in leases)
    assert gate.snapshot("free") == GateSnapshot(in_use=20, queued=0, limit=None, queue_limit=None)
    for lease in leases:
        await lease.release()
        await lease.release()
    assert gate.snapshot("free").in_use == 0
    assert gate.counters("free")["admitted"] == 20
    assert sorted(gate.upstreams()) == ["capped", "free"]
    await held.release()


async def test_drain_fails_waiters_and_lets_leases_finish(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=4)})
    lease = await gate.enter("up")
    ticket = await gate.enter("up")
    task = asyncio.create_task(ticket.wait(5.0))
    await asyncio.sleep(0.05)
    gate.drain()
    with pytest.raises(Draining):
        await task
    with pytest.raises(Draining):
        await gate.enter("up")
    assert not await gate.wait_idle(0.1)
    await lease.release()
    assert await gate.wait_idle(1.0)
    await asyncio.sleep(0.1)
    assert gate.snapshot("up") == GateSnapshot(in_use=0, queued=0, limit=1, queue_limit=4)
    assert gate.counters("up")["drained"] == 1


async def test_concurrent_load_never_exceeds_the_cap(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=3, depth=40, timeout=10)})
    current = peak = done = 0

    async def one() -> None:
        nonlocal current, peak, done
        entry = await gate.enter("up")
        lease = entry
        while lease.queued:
            lease = await entry.wait(1.0) or entry
        current += 1
        peak = max(peak, current)
        await asyncio.sleep(0.005)
        current -= 1
        await lease.release()
        done += 1

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(30))), 20)
    assert done == 30 and peak == 3
    assert gate.snapshot("up").in_use == 0 and gate.snapshot("up").queued == 0


async def test_snapshot_reports_the_oldest_waiters_wait(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": policy(cap=1, depth=4, timeout=30.0)})
    holder = await gate.enter("up")
    assert gate.snapshot("up").oldest_wait_seconds is None  # nobody waits
    ticket = await gate.enter("up")
    started = time.monotonic()
    await asyncio.sleep(0.6)
    deadline = time.monotonic() + 3  # the Redis gate reads it with its refresher (0.5 s)
    while (oldest := gate.snapshot("up").oldest_wait_seconds) is None or oldest < 0.5:
        assert time.monotonic() < deadline, oldest
        await asyncio.sleep(0.05)
    assert 0.5 <= oldest <= time.monotonic() - started + 0.1
    await ticket.cancel()
    await holder.release()
    deadline = time.monotonic() + 3
    while gate.snapshot("up").oldest_wait_seconds is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


# -- fairness = "tokens" (domain.admission.token_order), on both backends -----------------

def tokens_policy() -> AdmissionPolicy:
    return AdmissionPolicy(max_in_flight=1, queue_depth=16, queue_timeout_seconds=10, fairness="tokens",
                           output_token_weight=2.0)


async def serve(held: tuple[Any, Any, Consumer], tickets: dict[str, tuple[Any, Any, Consumer]],
                count: int, output: int = 50) -> tuple[list[str], tuple[Any, Any, Consumer]]:
    """`count` dispatches with cap 1: the lease's own gate charges its consumer `output` tokens
    (as a request's meter settles) and releases it; which ticket got the slot next, in order."""
    order = []
    for _ in range(count):
        gate, lease, consumer = held
        gate.charge("up", consumer, 0, output)
        await lease.release()
        granted = []
        for rid, (g, ticket, c) in list(tickets.items()):
            got = await ticket.wait(0)
            if got is not None:
                granted.append(rid)
                held = (g, got, c)
                del tickets[rid]
        assert len(granted) == 1, granted
        order.append(granted[0])
    return order, held


async def test_tokens_an_idle_consumer_is_lifted_and_shares_from_then_on(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": tokens_policy()})
    # on Redis a second "process" on the same ledger: each charges the leases it holds
    other = gate if make_gate.kind == "memory" else await make_gate({"up": tokens_policy()})  # type: ignore[attr-defined]
    a, b, c = Consumer(name="a"), Consumer(name="b"), Consumer(name="c")
    held = (gate, await gate.enter("up", a), a)
    tickets = {}
    for i, (rid, who) in enumerate([("a1", a), ("b1", b), ("a2", a), ("b2", b), ("a3", a), ("b3", b)]):
        g = (gate, other)[i % 2]
        tickets[rid] = (g, await g.enter("up", who), who)
    first, held = await serve(held, tickets, 4)
    assert first == ["b1", "a1", "b2", "a2"]  # 100 weighted tokens each time: they alternate
    for rid in ("c1", "c2"):  # c never waited: lifted to the least service waiting (b's 200), not left at 0
        tickets[rid] = (other, await other.enter("up", c), c)
    rest, held = await serve(held, tickets, 4)
    assert rest == ["b3", "c1", "a3", "c2"]  # neither first twice in a row nor last
    await held[1].release()


async def test_tokens_priority_bands_stay_strict_whatever_the_service(make_gate: MakeGate) -> None:
    gate = await make_gate({"up": tokens_policy()})
    a, vip = Consumer(name="a"), Consumer(name="vip", priority=10)
    held = (gate, await gate.enter("up", a), a)
    tickets = {rid: (gate, await gate.enter("up", who), who) for rid, who in [("a1", a), ("vip1", vip),
                                                                          ("a2", a), ("vip2", vip)]}
    gate.charge("up", vip, 10**6, 0)
    for _, ticket, _ in tickets.values():
        assert await ticket.wait(0) is None  # on Redis: reads the position again
    assert [t.position() for _, t, _ in tickets.values()] == [3, 1, 4, 2]
    order, held = await serve(held, tickets, 4)
    assert order == ["vip1", "vip2", "a1", "a2"]
    await held[1].release()


async def test_tokens_charges_of_two_processes_order_both(make_gate: MakeGate) -> None:
    one = await make_gate({"up": tokens_policy()})
    two = one if make_gate.kind == "memory" else await make_gate({"up": tokens_policy()})  # type: ignore[attr-defined]
    a, b = Consumer(name="a"), Consumer(name="b")
    held = (one, await one.enter("up", a), a)
    tickets = {"a1": (one, await one.enter("up", a), a), "b1": (two, await two.enter("up", b), b)}
    # a's long answer streams in process two (no call of its own there: the refresher carries it)
    two.charge("up", a, 0, 400)
    await asyncio.sleep(1.0)
    # process one dispatches: a was served 800, b nothing: b goes first though a came first
    order, held = await serve(held, tickets, 2, output=0)
    assert order == ["b1", "a1"]
    await held[1].release()


async def test_tokens_a_consumer_with_requests_running_is_not_lifted(make_gate: MakeGate) -> None:
    """Idle means nothing queued AND nothing holding slots: a consumer whose queue emptied
    while its requests run keeps its deficit; after its last release it is lifted again."""
    pol = AdmissionPolicy(max_in_flight=2, queue_depth=16, queue_timeout_seconds=10, fairness="tokens",
                          output_token_weight=2.0)
    gate = await make_gate({"up": pol})
    a, b = Consumer(name="a"), Consumer(name="b")

    async def next_grant(tickets: dict[str, Any]) -> tuple[str, Any]:
        got = [(rid, lease) for rid, ticket in tickets.items() if (lease := await ticket.wait(0)) is not None]
        assert len(got) == 1, got
        del tickets[got[0][0]]
        return got[0]

    b1, b2 = await gate.enter("up", b), await gate.enter("up", b)  # b holds both slots
    tickets = {"a1": await gate.enter("up", a)}
    gate.charge("up", a, 0, 500)  # a was served 1000 weighted tokens, b nothing
    await b1.release()
    _, a1 = await next_grant(tickets)
    # nothing queued, but b2 runs: b is not idle, keeps its 0 and goes ahead of a's older ticket
    tickets |= {"a2": await gate.enter("up", a), "b3": await gate.enter("up", b)}
    await a1.release()
    rid, b3 = await next_grant(tickets)
    assert rid == "b3"
    await b2.release()
    _, a2 = await next_grant(tickets)
    await b3.release()  # b's last request ends: b is idle
    a3 = await gate.enter("up", a)
    assert not a3.queued
    tickets |= {"a4": await gate.enter("up", a), "b4": await gate.enter("up", b)}  # b lifted to a's 1000
    await a2.release()
    rid, a4 = await next_grant(tickets)
    assert rid == "a4"  # a tie, and a's ticket is older
    await tickets["b4"].cancel()
    for lease in (a3, a4):
        await lease.release()
