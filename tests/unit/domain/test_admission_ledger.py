"""The slot ledger: examples, then a model-based state machine against a naive model."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from domain.admission.decisions import Cancel, Outcome
from domain.admission.ledger import SlotLedger
from domain.admission.policy import AdmissionPolicy


def ledger(cap: int = 2, depth: int = 3, timeout: float = 10.0, **kw: int) -> SlotLedger:
    policy = AdmissionPolicy(max_in_flight=cap, queue_depth=depth, queue_timeout_seconds=timeout)
    return SlotLedger(policy, **kw)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_in_flight": 0, "queue_depth": 1, "queue_timeout_seconds": 1}, "max_in_flight"),
        ({"max_in_flight": 1, "queue_depth": -1, "queue_timeout_seconds": 1}, "queue_depth"),
        ({"max_in_flight": 1, "queue_depth": 1, "queue_timeout_seconds": 0}, "queue_timeout_seconds"),
        (
            {"max_in_flight": 1, "queue_depth": 1, "queue_timeout_seconds": float("nan")},
            "queue_timeout_seconds",
        ),
        ({"max_in_flight": True, "queue_depth": 1, "queue_timeout_seconds": 1}, "max_in_flight"),
    ],
)
def test_policy_rejects_invalid_values_naming_the_field(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        AdmissionPolicy(**fields)  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match=named):
        msgspec.convert(fields, AdmissionPolicy)


def test_policy_has_no_defaults() -> None:
    with pytest.raises(TypeError):
        AdmissionPolicy(max_in_flight=1, queue_depth=1)  # type: ignore[call-arg]


def test_admits_to_the_cap_then_queues_then_rejects() -> None:
    led = ledger(cap=2, depth=2, timeout=5)
    assert [led.arrive(0).outcome for _ in range(2)] == [Outcome.ADMITTED] * 2
    q = led.arrive(1)
    assert (q.outcome, q.ticket, q.deadline) == (Outcome.QUEUED, 3, 6.0)
    assert led.arrive(1).outcome is Outcome.QUEUED
    r = led.arrive(1)
    assert r.outcome is Outcome.REJECTED and r.retry_after >= 1
    assert (led.in_flight, led.queued) == (2, 2)


def test_release_promotes_in_fifo_order_and_positions_follow() -> None:
    led = ledger(cap=1, depth=5)
    first = led.arrive(0).ticket
    waiting = [led.arrive(0).ticket for _ in range(4)]
    assert [led.position(t) for t in waiting] == [1, 2, 3, 4]
    assert led.cancel(waiting[1]) is Cancel.WITHDRAWN
    assert [led.position(t) for t in waiting] == [1, 0, 2, 3]
    assert led.release(first, 1) == [waiting[0]]
    assert led.holds(waiting[0]) and led.position(waiting[0]) == 0
    assert [led.position(t) for t in waiting[2:]] == [1, 2]
    assert led.release(waiting[0], 2) == [waiting[2]]


def test_cancel_outcomes() -> None:
    led = ledger(cap=1, depth=1)
    a, b = led.arrive(0).ticket, led.arrive(0).ticket
    assert led.cancel(a) is Cancel.HOLDS_SLOT  # the caller must release it
    assert led.cancel(b) is Cancel.WITHDRAWN
    assert led.cancel(b) is Cancel.ENDED
    assert led.release(a, 1) == []
    assert led.cancel(a) is Cancel.ENDED
    with pytest.raises(KeyError):
        led.release(a, 2)


def test_expiry_at_the_deadline_and_never_admitted_after_it() -> None:
    led = ledger(cap=1, depth=3, timeout=10)
    holder = led.arrive(0).ticket
    early, late = led.arrive(0).ticket, led.arrive(5).ticket
    assert led.expire(9.99) == []
    assert led.expire(10) == [early]  # deadline <= now expires
    assert led.position(late) == 1
    # past `late`'s deadline, a release does not admit it: it lapses, reported by expire
    assert led.release(holder, 20) == []
    assert led.expire(20) == [late]
    assert led.expire(21) == []
    assert led.counters()["timed_out"] == 2


def test_arrival_does_not_count_lapsed_tickets_against_the_depth() -> None:
    led = ledger(cap=1, depth=1, timeout=1)
    led.arrive(0)
    old = led.arrive(0).ticket
    assert led.arrive(0.5).outcome is Outcome.REJECTED
    assert led.arrive(1).outcome is Outcome.QUEUED
    assert led.expire(1) == [old]


def test_retry_after_estimate() -> None:
    led = ledger(cap=2, depth=10)
    assert led.retry_after() == 1  # no observation yet
    a = led.arrive(0).ticket
    led.arrive(0)
    led.release(a, 4.0)  # one service time of 4 s
    for _ in range(3):
        led.arrive(4)
    assert led.queued == 2
    assert led.retry_after() == 6  # ceil(4 * (2 + 1) / 2)
    assert led.retry_after(ahead=0) == 2
    assert led.retry_after(ahead=100) == 10  # clamped


def test_close_fails_the_queue_and_rejects_arrivals_but_lets_leases_finish() -> None:
    led = ledger(cap=1, depth=3)
    holder = led.arrive(0).ticket
    queued = [led.arrive(0).ticket for _ in range(2)]
    assert led.close() == queued
    assert led.arrive(1).outcome is Outcome.CLOSED
    assert led.release(holder, 2) == []
    assert (led.in_flight, led.queued) == (0, 0)
    assert led.counters()["drained"] == 2 and led.counters()["rejected_draining"] == 1


def test_positions_stay_exact_across_tree_rebuilds() -> None:
    rng = random.Random(7)
    led = ledger(cap=1, depth=50, timeout=1e9, min_capacity=2)
    holder = led.arrive(0).ticket
    queue: list[int] = []
    for step in range(5000):
        roll = rng.random()
        if roll < 0.5 and len(queue) < 50:
            queue.append(led.arrive(step).ticket)
        elif roll < 0.8 and queue:
            assert led.cancel(queue.pop(rng.randrange(len(queue)))) is Cancel.WITHDRAWN
        elif queue:
            assert led.release(holder, step) == [queue[0]]
            holder = queue.pop(0)
        if step % 50 == 0:
            assert [led.position(t) for t in queue] == list(range(1, len(queue) + 1))


class LedgerMachine(RuleBasedStateMachine):
    """The ledger against a list-based model; integer time keeps deadlines exact."""

    @initialize(cap=st.integers(1, 3), depth=st.integers(0, 4), timeout=st.integers(1, 5))
    def setup(self, cap: int, depth: int, timeout: int) -> None:
        self.cap, self.depth, self.timeout = cap, depth, timeout
        self.led = ledger(cap, depth, timeout, min_capacity=2)
        self.now = 0
        self.queue: list[tuple[int, int]] = []  # (ticket, deadline), FIFO
        self.holding: set[int] = set()
        self.lapsed: list[int] = []
        self.ended: dict[int, str] = {}
        self.issued = 0
        self.last_promoted = 0

    def end(self, ticket: int, how: str) -> None:
        assert ticket not in self.ended, f"ticket {ticket} ended twice"
        self.ended[ticket] = how

    def lapse(self) -> None:
        while self.queue and self.queue[0][1] <= self.now:
            self.lapsed.append(self.queue.pop(0)[0])

    @rule(dt=st.integers(0, 3))
    def tick(self, dt: int) -> None:
        self.now += dt

    @rule()
    def arrive(self) -> None:
        d = self.led.arrive(self.now)
        self.issued += 1
        assert d.ticket == self.issued
        if self.led.closed:
            assert d.outcome is Outcome.CLOSED
            self.end(d.ticket, "rejected")
        elif len(self.holding) < self.cap:
            assert d.outcome is Outcome.ADMITTED
            self.holding.add(d.ticket)
        else:
            self.lapse()
            if len(self.queue) < self.depth:
                assert d.outcome is Outcome.QUEUED and d.deadline == self.now + self.timeout
                self.queue.append((d.ticket, self.now + self.timeout))
            else:
                assert d.outcome is Outcome.REJECTED and 1 <= d.retry_after <= 10
                self.end(d.ticket, "rejected")

    @precondition(lambda self: self.holding)
    @rule(pick=st.integers(0, 99))
    def release(self, pick: int) -> None:
        ticket = sorted(self.holding)[pick % len(self.holding)]
        promoted = self.led.release(ticket, self.now)
        self.holding.remove(ticket)
        self.end(ticket, "released")
        self.lapse()
        expected = [t for t, _ in self.queue[: self.cap - len(self.holding)]]
        del self.queue[: len(expected)]
        assert promoted == expected
        for t in promoted:  # strict FIFO across the whole run
            assert t > self.last_promoted
            self.last_promoted = t
        self.holding.update(promoted)

    @rule(pick=st.integers(1, 60))
    def cancel(self, pick: int) -> None:
        ticket = pick if pick <= self.issued else self.issued + 1
        outcome = self.led.cancel(ticket)
        if any(t == ticket for t, _ in self.queue):
            assert outcome is Cancel.WITHDRAWN
            self.queue = [q for q in self.queue if q[0] != ticket]
            self.end(ticket, "withdrawn")
        elif ticket in self.holding:
            assert outcome is Cancel.HOLDS_SLOT
        else:
            assert outcome is Cancel.ENDED

    @rule()
    def expire(self) -> None:
        self.lapse()
        assert self.led.expire(self.now) == self.lapsed
        for t in self.lapsed:
            self.end(t, "expired")
        self.lapsed = []
        assert all(deadline > self.now for _, deadline in self.queue)

    @precondition(lambda self: not self.led.closed and self.issued >= 8)
    @rule()
    def close(self) -> None:
        assert self.led.close() == [t for t, _ in self.queue]
        for t, _ in self.queue:
            self.end(t, "drained")
        self.queue = []

    @invariant()
    def bounds_and_positions(self) -> None:
        led = self.led
        assert led.in_flight == len(self.holding) <= self.cap
        assert led.queued == len(self.queue) <= self.depth
        assert not self.queue or len(self.holding) == self.cap  # no idle slot next to a waiter
        assert [led.position(t) for t, _ in self.queue] == list(range(1, len(self.queue) + 1))
        assert all(led.holds(t) and led.position(t) == 0 for t in self.holding)

    def teardown(self) -> None:
        if not hasattr(self, "led"):
            return
        self.now += self.timeout + 1
        for t in self.led.close():
            self.end(t, "drained")
        for t in self.led.expire(self.now):
            self.end(t, "expired")
        for t in sorted(self.holding):
            assert self.led.release(t, self.now) == []
            self.end(t, "released")
        assert sorted(self.ended) == list(range(1, self.issued + 1))  # each ended, once
        c = self.led.counters()
        assert c["admitted"] == sum(h == "released" for h in self.ended.values())
        assert c["abandoned"] == sum(h == "withdrawn" for h in self.ended.values())
        assert c["timed_out"] == sum(h == "expired" for h in self.ended.values())


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, derandomize=True
)
