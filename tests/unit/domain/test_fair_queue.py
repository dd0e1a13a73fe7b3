"""Fair queueing: examples, then a state machine against a sorted-list model."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from domain.admission.decisions import Cancel, Outcome
from domain.admission.fair_order import SCALE, tag_step
from domain.admission.ledger import SlotLedger
from domain.admission.policy import FAIR, FIFO, AdmissionPolicy
from domain.consumers import ANONYMOUS, Consumer


def ledger(cap: int = 1, depth: int = 100, timeout: float = 1000.0, **kw: object) -> SlotLedger:
    policy = AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout, **kw)  # type: ignore[arg-type]
    return SlotLedger(policy)


A, B = Consumer(name="a"), Consumer(name="b")
HEAVY = Consumer(name="heavy", weight=3)
VIP = Consumer(name="vip", priority=10)


def drain(led: SlotLedger, holder: int, now: float = 1.0) -> list[int]:
    """Release one slot at a time (cap 1) and return the dispatch order."""
    order = []
    while True:
        promoted = led.release(holder, now)
        if not promoted:
            return order
        (holder,) = promoted
        order.append(holder)


def test_policy_checks_fairness_and_share() -> None:
    with pytest.raises(ValueError, match="fairness"):
        AdmissionPolicy(max_in_flight=1, queue_depth=1, queue_timeout_seconds=1, fairness="lifo")
    with pytest.raises(ValueError, match="max_queued_per_consumer"):
        AdmissionPolicy(max_in_flight=1, queue_depth=1, queue_timeout_seconds=1, max_queued_per_consumer=0)


def test_tag_steps_are_exact_and_clamp_at_16() -> None:
    assert all(tag_step(w) * w == SCALE for w in range(1, 17))
    assert tag_step(100) == tag_step(16)


@pytest.mark.parametrize("fairness", [FIFO, FAIR])
def test_one_consumer_is_served_in_arrival_order(fairness: str) -> None:
    led = ledger(fairness=fairness)
    holder = led.arrive(0, A).ticket
    tickets = [led.arrive(0, A).ticket for _ in range(10)]
    assert drain(led, holder) == tickets


def test_fifo_ignores_priority_and_weight() -> None:
    led = ledger(fairness=FIFO)
    holder = led.arrive(0, A).ticket
    tickets = [led.arrive(0, c).ticket for c in (A, A, HEAVY, VIP, B)]
    assert [led.position(t) for t in tickets] == [1, 2, 3, 4, 5]
    assert drain(led, holder) == tickets


def test_fair_alternates_equal_weights_after_a_backlog() -> None:
    led = ledger(fairness=FAIR)
    holder = led.arrive(0, A).ticket
    a = [led.arrive(0, A).ticket for _ in range(29)]
    holder = led.release(holder, 1)[0]  # one of A's is dispatched before B arrives
    b = [led.arrive(1, B).ticket for _ in range(5)]
    order = drain(led, holder)
    assert order[:10] == [a[1], b[0], a[2], b[1], a[3], b[2], a[4], b[3], a[5], b[4]]
    assert order[10:] == a[6:]


def test_weight_three_gets_three_slots_for_one() -> None:
    led = ledger(fairness=FAIR, depth=1000)
    holder = led.arrive(0, A).ticket
    owner = {}
    for _ in range(200):
        owner[led.arrive(0, A).ticket] = "a"
        owner[led.arrive(0, HEAVY).ticket] = "heavy"
    order = drain(led, holder)[:200]  # while both still wait
    counts = Counter(owner[t] for t in order)
    assert counts == {"heavy": 150, "a": 50}


def test_higher_priority_goes_first_and_pushes_positions_up() -> None:
    led = ledger(fairness=FAIR)
    holder = led.arrive(0, A).ticket
    a = [led.arrive(0, A).ticket for _ in range(3)]
    assert led.position(a[0]) == 1
    vip = led.arrive(0, VIP).ticket
    assert led.position(vip) == 1 and led.position(a[0]) == 2  # a position can go up
    assert led.queued_by_priority() == {0: 3, 10: 1}
    assert drain(led, holder) == [vip, *a]


def test_share_per_consumer_refuses_only_that_consumer() -> None:
    led = ledger(fairness=FAIR, max_queued_per_consumer=2)
    led.arrive(0, A)
    assert [led.arrive(0, A).outcome for _ in range(3)] == [Outcome.QUEUED, Outcome.QUEUED, Outcome.REJECTED]
    assert led.arrive(0, B).outcome is Outcome.QUEUED
    assert led.counters()["rejected_full"] == 1 and led.queued_of("a") == 2


def test_a_cancelled_waiter_leaves_no_trace() -> None:
    led = ledger(fairness=FAIR)
    holder = led.arrive(0, A).ticket
    gone = led.arrive(0, B).ticket
    kept = led.arrive(0, A).ticket
    assert led.cancel(gone) is Cancel.WITHDRAWN
    assert (led.position(gone), led.position(kept), led.queued_of("b")) == (0, 1, 0)
    assert led.queued_by_priority() == {0: 1}
    assert drain(led, holder) == [kept]


# -- model-based -----------------------------------------------------------------------

CONSUMERS = [
    ANONYMOUS,
    Consumer(name="a"),
    Consumer(name="b", weight=2),
    Consumer(name="c", weight=3),
    Consumer(name="d", weight=40),  # clamps at 16 for the tag
    Consumer(name="hi", priority=10),
    Consumer(name="low", priority=-5, weight=5),
]


class FairModel:
    """The contract written the slow way: a list of (key, ticket) sorted on every read,
    tags as exact fractions (1 / min(weight, 16) per request)."""

    def __init__(self, fairness: str) -> None:
        self.fairness = fairness
        self.waiting: dict[int, tuple[tuple[object, ...], str, float]] = {}  # ticket -> key, consumer, deadline
        self.virtual: dict[int, Fraction] = {}
        self.last: dict[tuple[int, str], Fraction] = {}

    def push(self, ticket: int, consumer: Consumer, deadline: float) -> None:
        if self.fairness == FIFO:
            key: tuple[object, ...] = (ticket,)
        else:
            p = consumer.priority
            start = max(self.virtual.get(p, Fraction(0)), self.last.get((p, consumer.name), Fraction(0)))
            finish = start + Fraction(1, min(consumer.weight, 16))
            self.last[(p, consumer.name)] = finish
            key = (-p, finish, ticket)
        self.waiting[ticket] = (key, consumer.name, deadline)

    def sorted(self) -> list[int]:
        return sorted(self.waiting, key=lambda t: self.waiting[t][0])

    def pop(self) -> int:
        ticket = self.sorted()[0]
        key = self.waiting.pop(ticket)[0]
        if self.fairness == FAIR:
            self.virtual[-key[0]] = key[1]  # type: ignore[operator,index]
        return ticket


class FairLedgerMachine(RuleBasedStateMachine):
    @initialize(
        cap=st.integers(1, 3),
        depth=st.integers(0, 12),
        fairness=st.sampled_from([FIFO, FAIR]),
        share=st.none() | st.integers(1, 4),
    )
    def setup(self, cap: int, depth: int, fairness: str, share: int | None) -> None:
        self.policy = AdmissionPolicy(
            max_in_flight=cap,
            queue_depth=depth,
            queue_timeout_seconds=5.0,
            fairness=fairness,
            max_queued_per_consumer=share,
        )
        self.led = SlotLedger(self.policy)
        self.model = FairModel(fairness)
        self.now = 0.0
        self.holding: set[int] = set()
        self.ended: set[int] = set()
        self.who: dict[int, Consumer] = {}
        self.served: dict[str, list[int]] = {}

    def _expire_model(self) -> None:
        for t in [t for t, (_, _, d) in self.model.waiting.items() if d <= self.now]:
            del self.model.waiting[t]
            self.ended.add(t)

    def _admit(self, promoted: list[int]) -> None:
        for t in promoted:
            assert self.model.pop() == t, "dispatch is not the smallest key"
            assert t not in self.holding and t not in self.ended, "admitted twice"
            self.holding.add(t)
            self.served.setdefault(self.who[t].name, []).append(t)

    @rule(consumer=st.sampled_from(CONSUMERS), dt=st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    def arrive(self, consumer: Consumer, dt: float) -> None:
        self.now += dt
        d = self.led.arrive(self.now, consumer)
        self.who[d.ticket] = consumer
        if d.outcome is Outcome.ADMITTED:
            assert not self.model.waiting
            self.holding.add(d.ticket)
            self.served.setdefault(consumer.name, []).append(d.ticket)
            return
        self._expire_model()
        full = len(self.model.waiting) >= self.policy.queue_depth
        share = self.policy.max_queued_per_consumer
        mine = sum(1 for _, name, _ in self.model.waiting.values() if name == consumer.name)
        if full or (share is not None and mine >= share):
            assert d.outcome is Outcome.REJECTED
            self.ended.add(d.ticket)
            return
        assert d.outcome is Outcome.QUEUED
        self.model.push(d.ticket, consumer, d.deadline)

    @precondition(lambda self: self.holding)
    @rule(data=st.data(), dt=st.sampled_from([0.0, 1.0, 3.0]))
    def release(self, data: st.DataObject, dt: float) -> None:
        self.now += dt
        t = data.draw(st.sampled_from(sorted(self.holding)))
        self.holding.discard(t)
        self.ended.add(t)
        promoted = self.led.release(t, self.now)
        self._expire_model()
        self._admit(promoted)

    @precondition(lambda self: self.who)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(sorted(self.who)))
        outcome = self.led.cancel(t)
        if t in self.model.waiting and outcome is Cancel.WITHDRAWN:
            del self.model.waiting[t]
            self.ended.add(t)
        elif t in self.holding:
            assert outcome is Cancel.HOLDS_SLOT
        else:
            assert outcome is Cancel.ENDED

    @rule(dt=st.sampled_from([0.0, 1.0, 6.0]))
    def expire(self, dt: float) -> None:
        self.now += dt
        self.led.expire(self.now)
        self._expire_model()

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "led"):
            return
        led, model = self.led, self.model
        assert led.in_flight == len(self.holding) <= self.policy.max_in_flight
        assert led.queued == len(model.waiting)
        order = model.sorted()
        assert [led.position(t) for t in order] == list(range(1, len(order) + 1))
        for t in self.ended:
            assert led.position(t) == 0 and not led.holds(t)
        by_priority = Counter(self.who[t].priority for t in model.waiting)
        assert led.queued_by_priority() == dict(by_priority)
        for c in CONSUMERS:
            assert led.queued_of(c.name) == sum(1 for t in model.waiting if self.who[t].name == c.name)
        for tickets in self.served.values():  # FIFO within a consumer
            assert tickets == sorted(tickets)
        if model.waiting:  # never a waiter next to a free slot
            assert led.in_flight == self.policy.max_in_flight


TestFairLedgerMachine = FairLedgerMachine.TestCase
TestFairLedgerMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
