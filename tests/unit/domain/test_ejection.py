"""Outlier ejection: Envoy's consecutive failures, ejection times and max_ejection_percent, with
the clock passed in; examples, then a state machine over random outcomes, clocks and ready sets."""

from __future__ import annotations

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from domain.ejection import EjectionPolicy, OutlierDetector
from domain.replicas import ReplicaSet, ReplicaState
from domain.upstream_failures import FailureKind

A, B, C, D = (f"http://10.0.0.{i}:8080" for i in range(1, 5))
RESET = FailureKind.RESET_BEFORE_HEAD
COUNTED = [k for k in FailureKind if k is not FailureKind.AFTER_HEAD]


def fail(detector: OutlierDetector, address: str, times: int, now: float, ready: set[str],
         kind: FailureKind = RESET) -> list[object]:  # fmt: skip
    return [e for e in (detector.failure(address, kind, now, ready) for _ in range(times)) if e is not None]


def test_five_counted_failures_in_a_row_eject_and_a_success_resets_the_count() -> None:
    detector, ready = OutlierDetector(), {A, B}
    assert fail(detector, A, 4, 0.0, ready) == []
    detector.success(A, 0.0)
    assert fail(detector, A, 4, 0.0, ready) == []  # the count started again
    assert detector.ejected(0.0, ready) == frozenset()
    assert len(fail(detector, A, 1, 0.0, ready)) == 1  # the fifth in a row
    assert detector.ejected(1.0, ready) == {A} and detector.ejected(30.0, ready) == frozenset()


@pytest.mark.parametrize("kind", COUNTED)
def test_every_counted_kind_counts(kind: FailureKind) -> None:
    detector = OutlierDetector()
    [ejection] = fail(detector, A, 5, 10.0, {A, B}, kind)
    assert ejection.address == A and ejection.until == 40.0 and ejection.seconds == 30 and ejection.times == 1  # type: ignore[attr-defined]


def test_a_4xx_a_client_gone_and_a_failure_after_the_head_neither_count_nor_reset() -> None:
    detector, ready = OutlierDetector(), {A, B}
    fail(detector, A, 4, 0.0, ready)
    for _ in range(10):
        assert detector.failure(A, None, 0.0, ready) is None  # 4xx / client gone: no kind
        assert detector.failure(A, FailureKind.AFTER_HEAD, 0.0, ready) is None
    assert detector.failure(A, RESET, 0.0, ready) is not None  # still the fifth in a row


def test_ejection_time_grows_with_each_ejection_up_to_the_max_and_the_replica_returns() -> None:
    detector, ready = OutlierDetector(EjectionPolicy(base_ejection_seconds=30, max_ejection_seconds=100)), {A, B}
    now, seconds = 0.0, []
    for _ in range(5):
        [ejection] = fail(detector, A, 5, now, ready)
        seconds.append(ejection.seconds)  # type: ignore[attr-defined]
        assert detector.ejected(now, ready) == {A} and detector.until(A, now) == now + ejection.seconds  # type: ignore[attr-defined]
        assert detector.refresh(now + ejection.seconds - 0.01, ready) == []  # type: ignore[attr-defined]
        now += ejection.seconds  # type: ignore[attr-defined]
        assert detector.ejected(now, ready) == frozenset() and detector.refresh(now, ready) == [A]
        assert detector.refresh(now, ready) == []  # one return, reported once
    assert seconds == [30, 60, 90, 100, 100]  # base x times ejected, at most max_ejection_seconds


def test_the_multiplier_decays_while_the_replica_serves() -> None:
    detector, ready = OutlierDetector(), {A, B}
    fail(detector, A, 5, 0.0, ready)
    detector.refresh(30.0, ready)
    [second] = fail(detector, A, 5, 31.0, ready)  # failing again at once: twice as long
    assert second.seconds == 60  # type: ignore[attr-defined]
    detector.refresh(91.0, ready)
    for _ in range(3):
        detector.success(A, 100.0)
    [third] = fail(detector, A, 5, 91.0 + 65.0, ready)  # served two base times: 2 - 2 + 1
    assert third.seconds == 30  # type: ignore[attr-defined]


def test_max_ejection_percent_and_the_last_eligible_replica() -> None:
    detector, ready = OutlierDetector(), {A, B, C}
    assert len(fail(detector, A, 5, 0.0, ready)) == 1
    assert fail(detector, B, 20, 0.0, ready) == []  # 2 of 3 > 50%: B keeps its count
    assert detector.ejected(0.0, ready) == {A}
    detector.refresh(30.0, ready)
    assert len(fail(detector, B, 1, 30.0, ready)) == 1  # A is back: B's next failure ejects it
    assert detector.ejected(30.0, ready) == {B}
    solo = OutlierDetector()
    assert fail(solo, A, 50, 0.0, {A}) == []  # the only replica always stays eligible
    pair = OutlierDetector(EjectionPolicy(max_ejection_percent=100))
    assert len(fail(pair, A, 5, 0.0, {A, B})) == 1 and fail(pair, B, 50, 0.0, {A, B}) == []  # never the last
    off = OutlierDetector(EjectionPolicy(max_ejection_percent=0))
    assert fail(off, A, 50, 0.0, {A, B, C}) == []
    small = OutlierDetector(EjectionPolicy(max_ejection_percent=10))
    assert len(fail(small, A, 5, 0.0, {A, B, C, D})) == 1  # one may always go (as Envoy)
    assert fail(small, B, 5, 0.0, {A, B, C, D}) == []


def test_outcomes_of_calls_in_flight_while_ejected_are_ignored() -> None:
    detector, ready = OutlierDetector(), {A, B}
    fail(detector, A, 5, 0.0, ready)
    assert fail(detector, A, 20, 1.0, ready) == []
    detector.success(A, 1.0)
    assert detector.until(A, 1.0) == 30.0  # not extended, not ended
    detector.refresh(30.0, ready)
    assert fail(detector, A, 4, 30.0, ready) == []  # back with its count at 0


def test_a_shrinking_ready_set_ends_ejections_it_cannot_afford() -> None:
    detector = OutlierDetector()
    fail(detector, A, 5, 0.0, {A, B})
    assert detector.ejected(1.0, {A}) == frozenset()  # A is all that is left: eligible
    assert detector.refresh(1.0, {A}) == [A]
    assert detector.ejected(2.0, {A, B}) == frozenset()  # it returned for good


def test_a_draining_ejected_replica_keeps_its_time_and_is_forgotten_when_gone() -> None:
    detector = OutlierDetector()
    fail(detector, A, 5, 0.0, {A, B, C})
    assert detector.refresh(5.0, {B, C}) == []  # left discovery: not a return
    assert detector.until(A, 5.0) == 30.0
    detector.retain({B, C})
    assert detector.until(A, 5.0) is None and detector.ejected(5.0, {A, B, C}) == frozenset()


def test_policy_checks_its_values() -> None:
    for bad in ({"consecutive_failures": 0}, {"base_ejection_seconds": 0}, {"max_ejection_percent": 101},
                {"base_ejection_seconds": 30, "max_ejection_seconds": 10}):  # fmt: skip
        with pytest.raises(ValueError):
            EjectionPolicy(**bad)  # type: ignore[arg-type]
    assert [EjectionPolicy().allowed(n) for n in range(6)] == [0, 0, 1, 1, 2, 2]


def test_ejected_replicas_leave_the_live_cap_and_get_nothing_new() -> None:
    replicas, detector, ready = ReplicaSet(4, [A, B]), OutlierDetector(), {A, B}
    assert replicas.take() == A
    fail(detector, A, 5, 0.0, ready)
    replicas.set_ejected(detector.ejected(0.0, ready))
    assert replicas.state(A) is ReplicaState.EJECTED and replicas.eligible() == {B}
    assert (replicas.capacity(), replicas.live_cap(6)) == (4, 4)  # as a draining replica's slots
    assert {replicas.take() for _ in range(4)} == {B} and replicas.take() is None
    replicas.release(A)  # its request in flight finishes normally; it is still known (ready)
    assert [(r.address, r.state) for r in replicas.replicas()] == [(A, ReplicaState.EJECTED), (B, ReplicaState.READY)]
    replicas.set_ejected(detector.ejected(30.0, ready))
    assert replicas.state(A) is ReplicaState.READY and replicas.take() == A and replicas.live_cap(6) == 6


# -- random outcomes, clocks and ready sets --------------------------------------------

POLICY = EjectionPolicy(consecutive_failures=3, base_ejection_seconds=10, max_ejection_seconds=35)


class EjectionMachine(RuleBasedStateMachine):
    """Checks the rule against a plain model: counts since the last success or return, the
    multiplier, the percent cap, and the eligible replica that always remains."""

    def __init__(self) -> None:
        super().__init__()
        self.detector = OutlierDetector(POLICY)
        self.now = 0.0
        self.ready = {A, B, C}
        self.counts = {a: 0 for a in (A, B, C, D)}  # counted failures in a row, as the model sees them
        self.times = {a: 0 for a in (A, B, C, D)}
        self.back_at: dict[str, float] = {}  # when the last ejection of each ended

    def _returned(self, returned: list[str]) -> None:
        for address in returned:
            self.counts[address] = 0
            self.back_at[address] = min(self.back_at.get(address, self.now), self.now)

    @rule(address=st.sampled_from([A, B, C, D]), kind=st.sampled_from([*FailureKind, None]))
    def failure(self, address: str, kind: FailureKind | None) -> None:
        self._returned(self.detector.refresh(self.now, self.ready))
        ejected_before = self.detector.ejected(self.now, self.ready)
        was_out = self.detector.until(address, self.now) is not None
        ejection = self.detector.failure(address, kind, self.now, self.ready)
        counted = kind is not None and kind is not FailureKind.AFTER_HEAD
        if counted and not was_out:
            self.counts[address] += 1
        if ejection is None:
            return
        event("ejected")
        assert counted and not was_out and address in self.ready
        assert self.counts[address] >= POLICY.consecutive_failures
        assert len(ejected_before) < POLICY.allowed(len(self.ready))
        decayed = self.times[address]
        if decayed and address in self.back_at:
            decayed = max(0, decayed - int((self.now - self.back_at[address]) // 10))
        self.times[address] = min(decayed + 1, POLICY.most_times)
        assert ejection.times == self.times[address]
        assert ejection.seconds == min(10 * ejection.times, 35) and ejection.until == self.now + ejection.seconds
        self.back_at[address] = ejection.until
        self.counts[address] = 0

    @rule(address=st.sampled_from([A, B, C, D]))
    def success(self, address: str) -> None:
        if self.detector.until(address, self.now) is None:
            self.detector.success(address, self.now)
            self.counts[address] = 0

    @rule(seconds=st.sampled_from([0.5, 3.0, 10.0, 40.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(ready=st.sets(st.sampled_from([A, B, C, D]), max_size=4))
    def discover(self, ready: set[str]) -> None:
        self.ready = ready
        self._returned(self.detector.refresh(self.now, ready))

    @invariant()
    def never_more_ejected_than_allowed_and_one_always_eligible(self) -> None:
        ejected = self.detector.ejected(self.now, self.ready)
        assert ejected <= self.ready and len(ejected) <= POLICY.allowed(len(self.ready))
        if self.ready:
            assert self.ready - ejected
        for address in ejected:
            until = self.detector.until(address, self.now)
            assert until is not None and until > self.now


EjectionMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
test_ejection_machine = EjectionMachine.TestCase


def test_the_safe_retry_moves_a_request_to_another_eligible_replica_in_one_step() -> None:
    replicas = ReplicaSet(2, [A, B, C])
    assert replicas.take(2) == A
    replicas.set_ejected([B])
    assert replicas.move(A, 2) == C  # never back to A, never to the ejected B
    assert (replicas.held(A), replicas.held(C), replicas.in_flight()) == (0, 2, 2)
    assert replicas.take(2) == A and replicas.move(C, 2) is None  # no other has room: nothing changes
    assert (replicas.held(A), replicas.held(C)) == (2, 2)
    with pytest.raises(KeyError):
        replicas.move(B)
