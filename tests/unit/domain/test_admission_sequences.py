"""The slot ledger with k slots per request and with replicas: examples, then a model-based
state machine against a naive model (head-of-line order, live cap, least loaded + round robin)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from domain.admission.decisions import Cancel, Outcome
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy
from domain.consumers import Consumer
from domain.errors import GatewayError, TooManySequences
from domain.replicas import ReplicaState

A, B, C = "http://127.0.0.2:8080", "http://127.0.0.3:8080", "http://127.0.0.4:8080"


def ledger(cap: int = 4, depth: int = 8, timeout: float = 10.0, fairness: str = "fifo",
           replica_limit: int | None = None) -> SlotLedger:
    policy = AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout,
                             fairness=fairness)
    return SlotLedger(policy, replica_limit=replica_limit)


def test_k_slots_are_taken_and_released_together() -> None:
    led = ledger(cap=4)
    first = led.arrive(0, slots=3)
    assert first.outcome is Outcome.ADMITTED and led.in_flight == 3 and led.requests == 1
    assert led.binding(first.ticket) == (3, None)
    assert led.arrive(0, slots=1).outcome is Outcome.ADMITTED  # 4 of 4
    waiting = led.arrive(0, slots=2)
    assert waiting.outcome is Outcome.QUEUED
    assert led.release(first.ticket, 1) == [waiting.ticket]  # all 3 came back: 2 fit
    assert led.in_flight == 3 and led.binding(waiting.ticket) == (2, None)


def test_a_k_request_at_the_head_is_not_overtaken() -> None:
    led = ledger(cap=4)
    held = [led.arrive(0).ticket for _ in range(3)]  # 3 of 4 in use
    big = led.arrive(0, slots=3)
    assert big.outcome is Outcome.QUEUED  # needs 3, one is free
    small = led.arrive(0)
    assert small.outcome is Outcome.QUEUED  # a free slot, but not ahead of the head
    assert led.in_flight == 3 and led.position(small.ticket) == 2
    assert led.release(held[0], 1) == []  # 2 free: the head still waits, nobody passes it
    assert led.release(held[1], 1) == [big.ticket]  # 3 free: the head takes them (1 + 3 = 4)
    assert led.release(held[2], 1) == [small.ticket]
    assert led.in_flight == 4


def test_a_blocked_head_that_leaves_lets_the_next_in() -> None:
    led = ledger(cap=2, timeout=5)
    held = led.arrive(0).ticket
    big = led.arrive(0, slots=2)
    small = led.arrive(1)
    assert led.cancel(big.ticket, 2) is Cancel.WITHDRAWN
    assert led.granted() == [small.ticket] and led.holds(small.ticket)
    # the same through the head's deadline
    led.release(small.ticket, 3)
    big = led.arrive(3, slots=2)
    small = led.arrive(4)
    assert (big.outcome, small.outcome) == (Outcome.QUEUED, Outcome.QUEUED)
    assert led.expire(8.5) == [big.ticket]
    assert led.granted() == [small.ticket]
    led.release(held, 9)
    led.release(small.ticket, 9)
    assert led.in_flight == 0 and led.queued == 0


def test_more_slots_than_the_cap_can_never_be_granted() -> None:
    led = ledger(cap=6)
    with pytest.raises(TooManySequences) as caught:
        led.arrive(0, slots=8)
    error = caught.value
    assert isinstance(error, GatewayError) and (error.status, error.kind) == (400, "too_many_sequences")
    assert (error.sequences, error.limit) == (8, 6)
    assert error.message == "this request needs 8 sequence slots, more than the 6 this upstream can ever grant"
    assert led.arrive(0, slots=6).outcome is Outcome.ADMITTED
    assert led.arrive(0).ticket == 2  # the refused request issued no ticket
    with pytest.raises(TooManySequences, match="needs 5 sequence slots, more than the 4"):
        ledger(cap=6, replica_limit=4).arrive(0, slots=5)  # one replica's limit
    with pytest.raises(ValueError, match="slots"):
        led.arrive(0, slots=0)


def test_k_slots_under_fair_order_wait_in_their_fair_place() -> None:
    led = ledger(cap=2, fairness="fair")
    held = led.arrive(0).ticket
    big = led.arrive(0, Consumer(name="a", priority=5), slots=2)  # high priority, needs 2
    low = led.arrive(0, Consumer(name="b"))
    assert led.position(big.ticket) == 1 and led.position(low.ticket) == 2
    assert led.release(held, 1) == [big.ticket]  # 2 free: the head takes both
    assert led.queued == 1 and led.in_flight == 2


def test_replicas_start_with_none_ready_and_queue() -> None:
    led = ledger(cap=6, replica_limit=4)
    assert led.live_cap() == 0
    first = led.arrive(0)
    assert first.outcome is Outcome.QUEUED
    assert led.set_replicas([A, B], 1) == [first.ticket]
    assert led.binding(first.ticket) == (1, A)
    assert led.live_cap() == 6


def test_replicas_fewest_in_flight_ties_rotate_and_the_live_cap_holds() -> None:
    led = ledger(cap=6, replica_limit=4)
    led.set_replicas([A, B], 0)
    tickets = [led.arrive(0).ticket for _ in range(6)]
    assert [led.binding(t)[1] for t in tickets] == [A, B, A, B, A, B]  # 3 + 3
    assert led.arrive(0).outcome is Outcome.QUEUED  # the cap of 6, though each replica has 1 free
    assert [(r.address, r.in_flight, r.state) for r in led.replica_view()] == [
        (A, 3, ReplicaState.READY), (B, 3, ReplicaState.READY)]


def test_k_slots_need_k_free_on_one_replica() -> None:
    led = ledger(cap=8, replica_limit=4)
    led.set_replicas([A, B], 0)
    ones = [led.arrive(0).ticket for _ in range(6)]  # A 3, B 3: 2 free in the cap, 1 per replica
    big = led.arrive(0, slots=2)
    assert big.outcome is Outcome.QUEUED  # 6 + 2 <= 8, but no replica has 2 free
    assert led.release(ones[0], 1) == [big.ticket]  # A has 2 free now
    assert led.binding(big.ticket) == (2, A)
    assert led.replicas is not None and led.replicas.held(A) == 4


def test_a_missing_replica_drains_and_is_forgotten_and_one_that_returns_keeps_its_counts() -> None:
    led = ledger(cap=8, replica_limit=4)
    led.set_replicas([A, B], 0)
    on_a = led.arrive(0).ticket
    on_b = led.arrive(0).ticket
    assert led.binding(on_a)[1] == A and led.binding(on_b)[1] == B
    led.set_replicas([B], 1)  # A drains: the live cap is B's 4, 2 of them in use (1 on A)
    assert led.live_cap() == 4
    assert [led.binding(led.arrive(1).ticket)[1] for _ in range(2)] == [B, B]
    assert led.arrive(1).outcome is Outcome.QUEUED  # 4 in flight = the live cap
    states = {r.address: (r.state, r.in_flight) for r in led.replica_view()}
    assert states == {A: (ReplicaState.DRAINING, 1), B: (ReplicaState.READY, 3)}
    assert led.set_replicas([A, B], 2) != []  # A returns with its count: the waiter goes to A
    assert {r.address: r.in_flight for r in led.replica_view()} == {A: 2, B: 3}
    led.set_replicas([B], 3)
    for ticket in list(led._held):
        if led.binding(ticket)[1] == A:
            led.release(ticket, 4)
    assert [r.address for r in led.replica_view()] == [B]  # forgotten at 0


# -- model-based: the ledger against a naive model ---------------------------------------

ADDRESSES = (A, B, C)


class Model:
    def __init__(self, cap: int, limit: int) -> None:
        self.cap, self.limit = cap, limit
        self.queue: list[tuple[int, int]] = []  # (ticket, k) in arrival order
        self.held: dict[int, tuple[int, str]] = {}
        self.counts: dict[str, int] = {}
        self.ready: set[str] = set()
        self.last: str | None = None

    def live_cap(self) -> int:
        return min(self.cap, len(self.ready) * self.limit)

    def pick(self, k: int) -> str | None:
        room = [a for a in sorted(self.ready) if self.limit - self.counts.get(a, 0) >= k]
        if not room:
            return None
        least = min(self.counts.get(a, 0) for a in room)
        best = [a for a in room if self.counts.get(a, 0) == least]
        later = [a for a in best if self.last is not None and a > self.last]
        return (later or best)[0]

    def admit(self, ticket: int, k: int) -> bool:
        if sum(k for k, _ in self.held.values()) + k > self.live_cap():
            return False
        address = self.pick(k)
        if address is None:
            return False
        self.held[ticket] = (k, address)
        self.counts[address] = self.counts.get(address, 0) + k
        self.last = address
        return True

    def promote(self) -> list[int]:
        out = []
        while self.queue and self.admit(*self.queue[0]):
            out.append(self.queue.pop(0)[0])
        return out

    def release(self, ticket: int) -> list[int]:
        k, address = self.held.pop(ticket)
        self.counts[address] -= k
        if not self.counts[address]:
            del self.counts[address]
        return self.promote()


class SequencesMachine(RuleBasedStateMachine):
    @initialize(cap=st.integers(1, 8), limit=st.integers(1, 4))
    def setup(self, cap: int, limit: int) -> None:
        self.led = ledger(cap=cap, depth=6, replica_limit=limit)
        self.model = Model(cap, limit)
        self.now = 0.0

    @rule(k=st.integers(1, 5))
    def arrive(self, k: int) -> None:
        m = self.model
        if k > m.cap or k > m.limit:
            with pytest.raises(TooManySequences):
                self.led.arrive(self.now, slots=k)
            return
        d = self.led.arrive(self.now, slots=k)
        if not m.queue and m.admit(d.ticket, k):
            assert d.outcome is Outcome.ADMITTED
            assert self.led.binding(d.ticket) == (k, m.held[d.ticket][1])
        elif len(m.queue) >= 6:
            assert d.outcome is Outcome.REJECTED
        else:
            assert d.outcome is Outcome.QUEUED
            m.queue.append((d.ticket, k))

    @precondition(lambda self: self.model.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.model.held)))
        assert self.led.release(ticket, self.now) == self.model.release(ticket)

    @precondition(lambda self: self.model.queue)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket, k = data.draw(st.sampled_from(self.model.queue))
        self.model.queue.remove((ticket, k))
        assert self.led.cancel(ticket, self.now) is Cancel.WITHDRAWN
        assert self.led.granted() == self.model.promote()

    @rule(ready=st.sets(st.sampled_from(ADDRESSES)))
    def discover(self, ready: set[str]) -> None:
        self.model.ready = set(ready)
        assert self.led.set_replicas(ready, self.now) == self.model.promote()

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "led"):
            return
        m, led = self.model, self.led
        assert led.in_flight == sum(k for k, _ in m.held.values()) <= max(m.cap, 0)
        assert led.queued == len(m.queue)
        view = {r.address: r.in_flight for r in led.replica_view()}
        assert {a: n for a, n in view.items() if n} == m.counts
        assert set(view) == m.ready | set(m.counts)  # draining ones listed until they reach 0
        assert all(n <= m.limit for n in view.values())
        for position, (ticket, _) in enumerate(m.queue, 1):
            assert led.position(ticket) == position


SequencesMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_sequences_machine = SequencesMachine.TestCase


def test_under_fair_order_a_newcomer_placed_ahead_of_a_blocked_head_goes_in_if_it_fits() -> None:
    led = ledger(cap=4, fairness="fair")
    held = led.arrive(0, slots=3).ticket
    blocked = led.arrive(0, Consumer(name="b"), slots=2)
    assert blocked.outcome is Outcome.QUEUED
    urgent = led.arrive(0, Consumer(name="hi", priority=5))  # sorts first, and 1 slot is free
    assert urgent.outcome is Outcome.ADMITTED and led.in_flight == 4
    assert led.queued == 1 and led.position(blocked.ticket) == 1
    assert led.release(held, 1) == [blocked.ticket]
