"""The in-process gate under `fairness = "tokens"`: charges order the queue; other upstreams ignore them."""

from __future__ import annotations

import pytest
from tests.unit.adapters.test_memory_gate import FakeClock
from tests.unit.adapters.test_memory_gate_fair import dispatch_order, enter

from adapters.outbound.memory_gate.gate import InMemoryAdmissionGate
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from ports.admission import SlotLease

A, B = Consumer(name="a"), Consumer(name="b")
VIP = Consumer(name="vip", priority=10)


def make_gate() -> InMemoryAdmissionGate:
    def policy(fairness: str) -> AdmissionPolicy:
        return AdmissionPolicy(max_in_flight=1, queue_depth=50, queue_timeout_seconds=30, fairness=fairness,
                               output_token_weight=2.0)
    return InMemoryAdmissionGate({"up": policy("tokens"), "fair": policy("fair"), "fifo": policy("fifo"),
                                  "open": None}, FakeClock())


def test_only_tokens_upstreams_are_metered() -> None:
    gate = make_gate()
    assert [gate.metered(u) for u in ("up", "fair", "fifo", "open")] == [True, False, False, False]
    for upstream in ("fair", "fifo", "open"):
        gate.charge(upstream, A, 100, 100)  # ignored
    with pytest.raises(KeyError):
        gate.metered("nope")


async def test_a_newcomer_is_lifted_to_the_level_of_those_waiting() -> None:
    gate = make_gate()
    holder = await gate.enter("up", A)
    gate.charge("up", A, 100, 200)  # a: 500 weighted tokens, b: never served
    tickets = {await enter(gate, A): "a0", await enter(gate, A): "a1", await enter(gate, B): "b0"}
    # b is lifted to a's 500: not ahead of a for 500 tokens; its place is a round robin's estimate
    assert [t.position() for t in tickets] == [1, 3, 2]
    order = await dispatch_order(gate, holder, tickets)  # type: ignore[arg-type]
    assert order == ["a0", "a1", "b0"]  # nobody charged meanwhile: a tie, in arrival order


async def test_charges_while_queued_reorder_and_priority_stays_strict() -> None:
    gate = make_gate()
    holder = await gate.enter("up", B)
    vip = await enter(gate, VIP)
    a = await enter(gate, A)
    b = await enter(gate, B)
    gate.charge("up", VIP, 10**6, 0)
    gate.charge("up", A, 1000, 0)  # a's running requests produced more than b's meanwhile
    assert (vip.position(), b.position(), a.position()) == (1, 2, 3)
    order = await dispatch_order(gate, holder, {vip: "vip", a: "a", b: "b"})  # type: ignore[arg-type]
    assert order == ["vip", "b", "a"]


async def test_an_admitted_lease_is_charged_like_a_queued_one() -> None:
    gate = make_gate()
    lease: SlotLease = await gate.enter("up", A)  # type: ignore[assignment]
    gate.charge("up", A, 10, 0)
    waiting = await enter(gate, B)
    gate.charge("up", A, 0, 5)
    ledger = gate._ups["up"].ledger
    assert ledger is not None and ledger.tokens is not None
    assert (ledger.tokens.service("a"), ledger.tokens.service("b")) == (20.0, 10.0)  # b lifted to a's 10 then
    await lease.release()
    assert waiting.position() == 0


def test_the_redis_gate_meters_tokens_upstreams_and_batches_their_charges() -> None:
    from adapters.outbound.redis_gate import RedisAdmissionGate

    def policy(fairness: str) -> AdmissionPolicy:
        return AdmissionPolicy(max_in_flight=1, queue_depth=5, queue_timeout_seconds=30, fairness=fairness,
                               output_token_weight=2.0)
    gate = RedisAdmissionGate({"up": policy("tokens"), "fair": policy("fair"), "open": None}, FakeClock(),
                              "redis://127.0.0.1:1")  # never reached: charges only gather here
    assert [gate.metered(u) for u in ("up", "fair", "open")] == [True, False, False]
    gate.charge("up", A, 10, 5)
    gate.charge("up", Consumer(name="x y:z", weight=4), 8, 0)
    gate.charge("up", A, 0, 1)
    gate.charge("fair", A, 100, 100)  # ignored
    up = gate._ups["up"]
    assert up.charges == {"a": 22.0, "x y:z": 2.0} and not gate._ups["fair"].charges
    assert up.take_charges() == f"61 22.0 {b'x y:z'.hex()} 2.0" and up.take_charges() == ""
