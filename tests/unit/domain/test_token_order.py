"""Token fairness (`fairness = "tokens"`, the Virtual Token Counter): the order alone, then a
ledger whose consumers are charged what they were served."""

from __future__ import annotations

from collections import Counter

import pytest

from domain.admission.decisions import Outcome
from domain.admission.ledger import SlotLedger
from domain.admission.policy import TOKENS, AdmissionPolicy
from domain.admission.token_order import TokenOrder
from domain.consumers import Consumer

PROMPT = 10  # every simulated request's prompt tokens


def ledger(cap: int = 1, output_token_weight: float = 2.0) -> SlotLedger:
    return SlotLedger(AdmissionPolicy(max_in_flight=cap, queue_depth=1000, queue_timeout_seconds=1000.0,
                                      fairness=TOKENS, output_token_weight=output_token_weight))


class Flood:
    """Consumers that each keep `waiting` requests queued on a cap-1 ledger; each admitted
    request is charged its prompt at admission and its answer (`answers`, tokens) before its
    release. `run` counts the dispatches per consumer."""

    def __init__(self, led: SlotLedger, answers: dict[Consumer, int], waiting: int = 4) -> None:
        assert led.tokens is not None
        self.led, self.order, self.answers, self.waiting = led, led.tokens, dict(answers), waiting
        first = next(iter(answers))
        self.holder = led.arrive(0.0, first).ticket
        self.who: dict[int, Consumer] = {self.holder: first}
        for consumer in answers:
            self.join(consumer)

    def join(self, consumer: Consumer, answer: int | None = None) -> list[int]:
        if answer is not None:
            self.answers[consumer] = answer
        tickets = [self.led.arrive(1.0, consumer).ticket for _ in range(self.waiting)]
        self.who.update(dict.fromkeys(tickets, consumer))
        return tickets

    def run(self, dispatches: int) -> list[str]:
        led, order, who, out = self.led, self.order, self.who, []
        for _ in range(dispatches):
            done = who.pop(self.holder)
            order.charge(done.name, done.weight, 0, self.answers[done])
            (self.holder,) = led.release(self.holder, 1.0)
            nxt = who[self.holder]
            out.append(nxt.name)
            order.charge(nxt.name, nxt.weight, PROMPT, 0)
            who[led.arrive(1.0, nxt).ticket] = nxt  # it refills its queue
        return out


def flood(led: SlotLedger, answers: dict[Consumer, int], dispatches: int) -> Counter[str]:
    return Counter(Flood(led, answers).run(dispatches))


def test_long_answers_are_dispatched_less_often_so_service_evens_out() -> None:
    a, b = Consumer(name="a"), Consumer(name="b")
    led = ledger()
    served = flood(led, {a: 400, b: 20}, 400)
    assert led.tokens is not None
    assert served["b"] > 10 * served["a"] > 0  # 810 vs 50 weighted tokens a request: ~16x
    sa, sb = led.tokens.service("a"), led.tokens.service("b")
    assert abs(sa - sb) <= 2 * (PROMPT + 2 * 400)  # within about one long answer


def test_weights_two_to_one_give_service_two_to_one() -> None:
    a, b = Consumer(name="a", weight=2), Consumer(name="b")
    led = ledger()
    served = flood(led, {a: 100, b: 100}, 300)
    assert served["a"] == pytest.approx(2 * served["b"], rel=0.1)


def test_output_token_weight_counts_output_against_prompt() -> None:
    order = TokenOrder(output_token_weight=3.0)
    order.charge("a", 1, 10, 5)
    order.charge("b", 2, 10, 5)
    order.charge("a", 1, -4, 0)  # a correction: the prompt estimate leaned high
    assert order.service("a") == 21.0
    assert order.service("b") == 12.5


def test_priority_is_strict_whatever_the_service() -> None:
    order = TokenOrder()
    order.charge("vip", 1, 10**9, 0)
    order.push(1, "a", 0, 1)
    order.push(2, "vip", 10, 1)
    order.push(3, "vip", 10, 1)
    assert [order.pop() for _ in range(3)] == [2, 3, 1]


def test_arrival_order_within_a_consumer() -> None:
    order = TokenOrder()
    order.charge("b", 1, 100, 0)
    for ticket in range(1, 6):
        order.push(ticket, "a", 0, 1)
    order.push(6, "b", 0, 1)
    assert order.rank(1) == 1
    assert order.rank(6) == 2  # an estimate: a round robin from here (the charges decide)
    popped = []
    while len(order):
        ticket = order.pop()
        popped.append(ticket)
        order.charge("a" if ticket < 6 else "b", 1, 30, 0)
    assert popped == [1, 2, 3, 4, 6, 5]
    assert order.rank(1) == 0


def test_idle_return_is_lifted_and_admitted_within_a_few_dispatches() -> None:
    a, b, c = Consumer(name="a"), Consumer(name="b"), Consumer(name="c")
    sim = Flood(ledger(), {a: 200, b: 200})
    sim.run(100)  # a and b: about 20,000 weighted tokens each
    least = min(sim.order.service("a"), sim.order.service("b"))
    assert least > 10_000
    returning = sim.join(c, 200)  # c was never served: 0 without the lift
    assert sim.order.service("c") == least
    assert 1 <= sim.led.position(returning[0]) <= 3
    nxt = sim.run(12)
    assert "c" in nxt[:3]
    # lifted, not put ahead of everyone for 20,000 tokens: a and b keep their turns
    assert Counter(nxt) == Counter(a=4, b=4, c=4)


def test_a_consumer_that_was_served_more_is_not_lowered_on_return() -> None:
    order = TokenOrder()
    order.charge("a", 1, 500, 0)
    order.push(1, "b", 0, 1)
    order.push(2, "a", 0, 1)
    assert order.service("a") == 500  # the lift only raises
    assert order.pop() == 1


def test_an_empty_band_lifts_to_the_last_dispatched() -> None:
    order = TokenOrder()
    order.charge("a", 1, 300, 0)
    order.push(1, "a", 0, 1)
    assert order.pop() == 1
    order.push(2, "b", 0, 1)  # nobody waits: the level is a's when it was dispatched
    assert order.service("b") == 300


def test_removed_tickets_and_clear() -> None:
    order = TokenOrder()
    for ticket, who in enumerate("aabb", 1):
        order.push(ticket, who, 0, 1)
    assert order.remove(2) and not order.remove(2)
    assert len(order) == 3
    assert sorted(order.rank(t) for t in (1, 3, 4)) == [1, 2, 3]
    order.clear()
    assert len(order) == 0 and order.rank(1) == 0


def test_a_consumer_holding_slots_is_not_idle_so_not_lifted() -> None:
    order = TokenOrder()
    order.charge("a", 1, 1000, 0)
    order.admitted(1, "b", 0)  # b holds a slot, nothing queued
    order.push(2, "a", 0, 1)
    order.push(3, "b", 0, 1)  # b arrives again while its request runs: it never left
    assert order.service("b") == 0
    assert order.pop() == 3 and order.holding("b") == 2
    order.released(1)
    order.released(3)
    assert order.holding("b") == 0
    order.push(4, "b", 0, 1)  # after its last release b is idle: lifted to a's level
    assert order.service("b") == 1000


def test_the_ledger_keeps_the_deficit_of_a_consumer_with_requests_running() -> None:
    a, b = Consumer(name="a"), Consumer(name="b")
    led = ledger(cap=2)
    assert led.tokens is not None
    b1 = led.arrive(0.0, b).ticket
    b2 = led.arrive(0.0, b).ticket  # b holds both slots
    a1 = led.arrive(0.0, a).ticket
    b3 = led.arrive(0.0, b).ticket
    led.tokens.charge("a", 1, 1000, 0)  # a was served far more before
    assert led.release(b1, 1.0) == [b3]  # b still the least served
    assert led.release(b2, 1.0) == [a1]
    # b's queue is empty but b3 runs: b arrives again and keeps its deficit (not lifted to a's)
    b4 = led.arrive(1.0, b).ticket
    assert led.tokens.service("b") == 0 and led.position(b4) == 1
    led.cancel(b4)
    assert led.release(b3, 2.0) == []  # b's last request ends: it is idle
    led.arrive(2.0, a)  # a takes the free slot
    assert led.arrive(2.0, b).outcome is Outcome.QUEUED
    assert led.tokens.service("b") == 1000  # lifted on its return (a's, the last admitted)
