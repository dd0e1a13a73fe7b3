"""The slot ledger with ejected and saturated replicas, affinity at arrival and the one safe
retry's move: the ledger side of `domain.replicas.ReplicaSet`'s rules."""

from __future__ import annotations

from domain.admission.decisions import Outcome
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy

A, B, C = "http://127.0.0.2:8080", "http://127.0.0.3:8080", "http://127.0.0.4:8080"


def ledger(cap: int = 6, limit: int = 2, ready: tuple[str, ...] = (A, B, C)) -> SlotLedger:
    led = SlotLedger(AdmissionPolicy(max_in_flight=cap, queue_depth=8, queue_timeout_seconds=10.0),
                     replica_limit=limit)
    led.set_replicas(ready, 0)
    return led


def test_an_ejected_replica_gets_nothing_new_and_its_slots_leave_the_live_cap() -> None:
    led = ledger()
    led.set_ejected([B], 0)
    assert led.live_cap() == 4
    tickets = [led.arrive(0) for _ in range(5)]
    assert [t.outcome for t in tickets] == [Outcome.ADMITTED] * 4 + [Outcome.QUEUED]
    assert {led.binding(t.ticket)[1] for t in tickets[:4]} == {A, C}
    # B returns: the queued one goes in at once, to B
    assert led.set_ejected([], 1) == [tickets[4].ticket]
    assert led.binding(tickets[4].ticket) == (1, B)


def test_a_saturated_replica_gets_nothing_new_but_keeps_its_slots_in_the_cap() -> None:
    led = ledger()
    led.set_saturated([A], 0)
    assert led.live_cap() == 6
    tickets = [led.arrive(0) for _ in range(5)]
    assert [t.outcome for t in tickets] == [Outcome.ADMITTED] * 4 + [Outcome.QUEUED]
    assert A not in {led.binding(t.ticket)[1] for t in tickets[:4]}
    assert led.set_saturated([], 1) == [tickets[4].ticket]
    assert led.binding(tickets[4].ticket)[1] == A


def test_affinity_at_arrival_within_max_extra_of_the_least_loaded() -> None:
    led = ledger(limit=4)
    first = led.arrive(0, prefer=[C])
    assert led.binding(first.ticket)[1] == C  # all at 0: C is within 0 of the least
    second = led.arrive(0, prefer=[C])
    assert led.binding(second.ticket)[1] != C  # C has 1, the least 0: not within max_extra 0
    third = led.arrive(0, prefer=[C], max_extra=1)
    assert led.binding(third.ticket)[1] == C  # within 1 of the least loaded


def test_a_move_keeps_the_count_and_goes_to_another_replica_with_room() -> None:
    led = ledger(cap=6, limit=2, ready=(A, B))
    held = [led.arrive(0) for _ in range(3)]  # A 2, B 1 (or the mirror)
    on_full = next(t for t in held if sum(led.binding(o.ticket)[1] == led.binding(t.ticket)[1] for o in held) == 2)
    source = led.binding(on_full.ticket)[1]
    target, granted = led.move(on_full.ticket, 1)
    assert target is not None and target != source and granted == []
    assert led.in_flight == 3 and led.binding(on_full.ticket) == (1, target)
    assert {r.address: r.in_flight for r in led.replica_view()} == {source: 1, target: 2}


def test_a_move_with_no_room_elsewhere_changes_nothing() -> None:
    led = ledger(cap=6, limit=1, ready=(A, B))
    a, b = led.arrive(0), led.arrive(0)
    assert led.move(a.ticket, 0) == (None, [])
    assert led.binding(a.ticket)[1] != led.binding(b.ticket)[1]
    assert led.in_flight == 2


def test_a_move_never_goes_to_an_ejected_or_saturated_replica() -> None:
    led = ledger(cap=6, limit=2)
    t = led.arrive(0, prefer=[A])
    assert led.binding(t.ticket)[1] == A
    led.set_ejected([B], 0)
    led.set_saturated([C], 0)
    assert led.move(t.ticket, 0) == (None, [])
    led.set_saturated([], 0)
    assert led.move(t.ticket, 0)[0] == C


def test_the_room_a_move_leaves_admits_a_waiting_k_request() -> None:
    led = ledger(cap=6, limit=2)
    on = {r: led.arrive(0, prefer=[r], max_extra=1) for r in (A, B, C)}
    extra = led.arrive(0, prefer=[A], max_extra=1)  # A 2, B 1, C 1
    assert led.binding(extra.ticket)[1] == A
    waiting = led.arrive(0, slots=2)  # 4 + 2 fits the cap, but no replica has 2 free
    assert waiting.outcome is Outcome.QUEUED
    target, granted = led.move(on[B].ticket, 1)  # B's request moves to C: B is empty now
    assert target == C and granted == [waiting.ticket]
    assert led.binding(waiting.ticket) == (2, B) and led.in_flight == 6
