"""The in-process admission gate on asyncio, driven by a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from adapters.outbound.system_clock import SystemClock
from domain.admission.policy import AdmissionPolicy
from domain.errors import Draining, QueueFull, QueueTimeout
from ports.admission import AdmissionGate, QueueTicket, SlotLease


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make_gate(cap: int = 1, depth: int = 3, timeout: float = 30.0) -> tuple[InMemoryAdmissionGate, FakeClock]:
    clock = FakeClock()
    policy = AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout)
    return InMemoryAdmissionGate({"reasoning": policy, "qwen": None}, clock), clock


async def lease_of(gate: AdmissionGate, upstream: str = "reasoning") -> SlotLease:
    entry = await gate.enter(upstream)
    assert entry.queued is False
    return entry  # type: ignore[return-value]


async def ticket_of(gate: AdmissionGate, upstream: str = "reasoning") -> QueueTicket:
    entry = await gate.enter(upstream)
    assert entry.queued is True
    return entry  # type: ignore[return-value]


def test_satisfies_the_port() -> None:
    gate: AdmissionGate = InMemoryAdmissionGate({}, SystemClock())
    assert gate.upstreams() == []


async def test_immediate_grant_and_idempotent_release() -> None:
    gate, _ = make_gate(cap=2)
    a, b = await lease_of(gate), await lease_of(gate)
    assert gate.snapshot("reasoning").in_use == 2
    await a.release()
    await a.release()  # a second release must not free b's slot
    assert gate.snapshot("reasoning").in_use == 1
    await b.release()
    assert gate.snapshot("reasoning").in_use == 0
    assert gate.counters("reasoning")["admitted"] == 2


async def test_queue_then_grant_in_fifo_order_with_positions() -> None:
    gate, _ = make_gate(cap=1, depth=3)
    holder = await lease_of(gate)
    tickets = [await ticket_of(gate) for _ in range(3)]
    assert [t.position() for t in tickets] == [1, 2, 3]
    assert gate.snapshot("reasoning").queued == 3
    waits = [asyncio.create_task(t.wait(5)) for t in tickets]
    await asyncio.sleep(0)
    current = holder
    for i in range(3):
        await current.release()
        async with asyncio.timeout(1):
            lease = await waits[i]  # the oldest waiter, and nobody else, got the slot
        assert lease is not None and not any(w.done() for w in waits[i + 1 :])
        assert [t.position() for t in tickets] == [0] * (i + 1) + list(range(1, 3 - i))
        current = lease
    await current.release()
    assert gate.snapshot("reasoning").in_use == 0


async def test_wait_timeout_returns_none_while_still_queued() -> None:
    gate, _ = make_gate()
    await lease_of(gate)
    ticket = await ticket_of(gate)
    assert await ticket.wait(0.01) is None
    assert await ticket.wait(0) is None
    assert ticket.position() == 1


async def test_queue_timeout_once_the_deadline_passes() -> None:
    gate, clock = make_gate(timeout=30)
    await lease_of(gate)
    ticket = await ticket_of(gate)
    clock.advance(30)
    with pytest.raises(QueueTimeout) as caught:
        await ticket.wait(1)
    assert (caught.value.retry_after or 0) >= 1
    assert gate.snapshot("reasoning").queued == 0
    assert gate.counters("reasoning")["timed_out"] == 1
    await ticket.cancel()  # no-op on an ended ticket
    assert gate.counters("reasoning")["abandoned"] == 0


async def test_a_blocked_waiter_learns_of_its_expiry_from_other_traffic() -> None:
    gate, clock = make_gate(timeout=30)
    await lease_of(gate)
    ticket = await ticket_of(gate)
    waiting = asyncio.create_task(ticket.wait(5))
    await asyncio.sleep(0)
    clock.advance(31)
    await ticket_of(gate)  # this enter expires the first waiter and wakes it
    with pytest.raises(QueueTimeout):
        await waiting


async def test_the_wait_timer_enforces_the_deadline_without_other_traffic() -> None:
    gate, _ = make_gate(timeout=0.02)  # the fake clock never moves: the timer decides
    await lease_of(gate)
    ticket = await ticket_of(gate)
    with pytest.raises(QueueTimeout):
        await ticket.wait(5)


async def test_queue_full_is_rejected_with_retry_after() -> None:
    gate, _ = make_gate(cap=1, depth=1)
    await lease_of(gate)
    await ticket_of(gate)
    with pytest.raises(QueueFull) as caught:
        await gate.enter("reasoning")
    assert (caught.value.retry_after or 0) >= 1 and caught.value.status == 503
    assert gate.counters("reasoning")["rejected_full"] == 1


async def test_cancelling_a_waiting_task_leaves_the_queue_without_a_slot() -> None:
    gate, _ = make_gate(cap=1)
    holder = await lease_of(gate)
    ticket = await ticket_of(gate)
    task = asyncio.create_task(ticket.wait(5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.snapshot("reasoning").queued == 0
    await holder.release()
    assert gate.snapshot("reasoning").in_use == 0  # the hung-up waiter got nothing
    assert gate.counters("reasoning")["abandoned"] == 1


async def test_cancellation_racing_a_grant_gives_the_slot_back() -> None:
    gate, _ = make_gate(cap=1)
    holder = await lease_of(gate)
    first, second = await ticket_of(gate), await ticket_of(gate)
    task = asyncio.create_task(first.wait(5))
    await asyncio.sleep(0)
    await holder.release()  # grants `first`: its future is resolved...
    task.cancel()  # ...and its task cancelled before it ever runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    snap = gate.snapshot("reasoning")
    assert (snap.in_use, snap.queued) == (1, 0)  # the slot went on to `second`
    lease = await second.wait(0)
    assert lease is not None
    await lease.release()
    assert gate.snapshot("reasoning").in_use == 0


async def test_cancel_gives_back_a_slot_granted_while_nobody_waited() -> None:
    gate, _ = make_gate(cap=1)
    holder = await lease_of(gate)
    ticket = await ticket_of(gate)
    await holder.release()  # granted, but the ticket's owner is not waiting
    assert gate.snapshot("reasoning").in_use == 1
    await ticket.cancel()
    await ticket.cancel()
    assert gate.snapshot("reasoning").in_use == 0


async def test_cancel_from_another_task_wakes_the_waiter() -> None:
    gate, _ = make_gate()
    await lease_of(gate)
    ticket = await ticket_of(gate)
    task = asyncio.create_task(ticket.wait(5))
    await asyncio.sleep(0)
    await ticket.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.snapshot("reasoning").queued == 0


async def test_an_uncapped_upstream_never_waits_behind_a_saturated_one() -> None:
    gate, _ = make_gate(cap=1, depth=1)
    await lease_of(gate)
    await ticket_of(gate)
    leases = [await lease_of(gate, "qwen") for _ in range(100)]
    snap = gate.snapshot("qwen")
    assert (snap.in_use, snap.queued, snap.limit, snap.queue_limit) == (100, 0, None, None)
    for lease in leases:
        await lease.release()
        await lease.release()
    assert gate.snapshot("qwen").in_use == 0
    assert gate.counters("qwen")["admitted"] == 100
    assert sorted(gate.upstreams()) == ["qwen", "reasoning"]


async def test_drain_fails_waiters_refuses_entries_and_lets_leases_finish() -> None:
    gate, _ = make_gate(cap=1)
    holder = await lease_of(gate)
    uncapped = await lease_of(gate, "qwen")
    ticket = await ticket_of(gate)
    idle_ticket = await ticket_of(gate)  # queued, nobody waiting on it
    waiting = asyncio.create_task(ticket.wait(5))
    await asyncio.sleep(0)
    gate.drain()
    with pytest.raises(Draining):
        await waiting
    with pytest.raises(Draining):
        await idle_ticket.wait(1)
    for upstream in ("reasoning", "qwen"):
        with pytest.raises(Draining) as caught:
            await gate.enter(upstream)
        assert caught.value.retry_after == 1
    assert gate.snapshot("reasoning").queued == 0
    assert await gate.wait_idle(0.01) is False
    idle = asyncio.create_task(gate.wait_idle(5))
    await asyncio.sleep(0)
    await holder.release()
    await asyncio.sleep(0)
    assert not idle.done()  # the uncapped lease is still out
    await uncapped.release()
    assert await idle is True
    assert gate.counters("reasoning")["drained"] == 2


async def test_refusals_while_draining_are_counted() -> None:
    class Clock:
        def now(self) -> float:
            return 0.0

    gate = InMemoryAdmissionGate(
        {"capped": AdmissionPolicy(max_in_flight=1, queue_depth=1, queue_timeout_seconds=5), "open": None}, Clock()
    )
    gate.drain()
    for upstream in ("capped", "open"):
        with pytest.raises(Draining):
            await gate.enter(upstream)
    assert gate.counters("capped")["rejected_draining"] == 1


async def test_snapshot_tells_how_long_the_oldest_waiter_has_waited() -> None:
    gate, clock = make_gate(cap=1, depth=3)
    holder = await lease_of(gate)
    assert gate.snapshot("reasoning").oldest_wait_seconds is None  # nobody waits
    first = await ticket_of(gate)
    clock.advance(2.0)
    second = await ticket_of(gate)
    clock.advance(0.5)
    assert gate.snapshot("reasoning").oldest_wait_seconds == pytest.approx(2.5)
    await first.cancel()
    assert gate.snapshot("reasoning").oldest_wait_seconds == pytest.approx(0.5)
    await second.cancel()
    await holder.release()
    assert gate.snapshot("reasoning").oldest_wait_seconds is None
