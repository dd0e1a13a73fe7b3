"""The in-process gate under `fairness = "fair"`: order, share, positions, counts."""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.adapters.test_memory_gate import FakeClock

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from domain.admission.policy import AdmissionPolicy
from domain.consumers import ANONYMOUS, Consumer
from domain.errors import QueueFull
from ports.admission import QueueTicket, SlotLease

A, B = Consumer(name="a"), Consumer(name="b")
VIP = Consumer(name="vip", priority=10)


def make_gate(fairness: str = "fair", depth: int = 50, share: int | None = None) -> InMemoryAdmissionGate:
    policy = AdmissionPolicy(max_in_flight=1, queue_depth=depth, queue_timeout_seconds=30,
                             fairness=fairness, max_queued_per_consumer=share)
    return InMemoryAdmissionGate({"up": policy}, FakeClock())


async def enter(gate: InMemoryAdmissionGate, consumer: Consumer) -> QueueTicket:
    entry = await gate.enter("up", consumer)
    assert entry.queued
    return entry  # type: ignore[return-value]


async def dispatch_order(gate: InMemoryAdmissionGate, holder: SlotLease, tickets: dict[QueueTicket, str]) -> list[str]:
    """Release one slot at a time and note whose ticket got it."""
    order = []
    while tickets:
        await holder.release()
        granted = [t for t in tickets if t.position() == 0]
        assert len(granted) == 1
        lease = await granted[0].wait(0)
        assert lease is not None
        order.append(tickets.pop(granted[0]))
        holder = lease
    await holder.release()
    return order


@pytest.mark.parametrize(("fairness", "expected"), [("fifo", "aaaabb"), ("fair", "ababaa")])
async def test_fair_interleaves_where_fifo_keeps_arrival_order(fairness: str, expected: str) -> None:
    gate = make_gate(fairness)
    holder = await gate.enter("up", A)
    tickets = {await enter(gate, A): f"a{i}" for i in range(4)}
    tickets.update({await enter(gate, B): f"b{i}" for i in range(2)})
    order = await dispatch_order(gate, holder, tickets)  # type: ignore[arg-type]
    assert "".join(name[0] for name in order) == expected
    assert [n for n in order if n[0] == "a"] == ["a0", "a1", "a2", "a3"]  # arrival order within one


async def test_priority_jumps_the_queue_and_is_counted_per_priority() -> None:
    gate = make_gate()
    holder = await gate.enter("up", A)
    waiting = [await enter(gate, A) for _ in range(3)]
    vip = await enter(gate, VIP)
    assert [t.position() for t in waiting] == [2, 3, 4] and vip.position() == 1
    snap = gate.snapshot("up")
    assert (snap.queued, snap.queued_by_priority) == (4, {0: 3, 10: 1})
    await holder.release()  # type: ignore[union-attr]
    assert vip.position() == 0 and await vip.wait(0) is not None
    assert [t.position() for t in waiting] == [1, 2, 3]


async def test_a_consumer_at_its_share_is_refused_others_still_get_in() -> None:
    gate = make_gate(share=2)
    await gate.enter("up", A)
    await enter(gate, A)
    await enter(gate, A)
    with pytest.raises(QueueFull) as refused:
        await gate.enter("up", A)
    assert refused.value.retry_after >= 1
    await enter(gate, B)
    assert gate.counters("up")["rejected_full"] == 1


async def test_anonymous_fair_is_fifo() -> None:
    gate = make_gate()
    holder = await gate.enter("up")
    tickets = {await enter(gate, ANONYMOUS): str(i) for i in range(5)}
    assert await dispatch_order(gate, holder, tickets) == ["0", "1", "2", "3", "4"]  # type: ignore[arg-type]


async def test_a_hang_up_leaves_no_trace_in_fair_order() -> None:
    gate = make_gate()
    holder = await gate.enter("up", A)
    gone = await enter(gate, B)
    kept = await enter(gate, A)
    waiting = asyncio.create_task(gone.wait(10))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (gone.position(), kept.position()) == (0, 1)
    assert gate.snapshot("up").queued_by_priority == {0: 1}
    await holder.release()  # type: ignore[union-attr]
    assert await kept.wait(0) is not None
