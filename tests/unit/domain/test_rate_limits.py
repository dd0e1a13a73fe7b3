"""Consumer rate limits: examples, then hypothesis against a reference model in exact fractions.

A request is decided in two steps: `take_request` (requests per minute, before the body is
read) and `reserve_tokens` (the token limits, once it is decoded). Times are whole
milliseconds, passed as seconds (`ms / 1000`) like a wall clock would.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from domain.consumers import ConsumerLimits, LimitKind, RateSnapshot, RateState
from domain.errors import RateLimited
from domain.rate_limits import DAY_MS, ConsumerUsage, Receipt, Refusal

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms: a UTC midnight


def at(ms: int) -> float:
    return ms / 1000


def test_requests_per_minute_admits_the_limit_then_refuses_until_one_refills() -> None:
    limits = ConsumerLimits(requests_per_minute=10)
    usage = ConsumerUsage()
    snapshots = [usage.take_request(limits, at(T0)) for _ in range(10)]
    assert [s.requests.remaining for s in snapshots if s.requests] == list(range(9, -1, -1))
    assert snapshots[-1] == RateSnapshot(
        requests=RateState(kind=LimitKind.REQUESTS_PER_MINUTE, limit=10, remaining=0, reset_seconds=60.0))
    with pytest.raises(RateLimited) as caught:
        usage.take_request(limits, at(T0 + 1000))
    assert caught.value.limit is LimitKind.REQUESTS_PER_MINUTE
    assert caught.value.retry_after == 5  # one request per 6 s; 1 s has passed
    assert caught.value.snapshot.requests is not None and caught.value.snapshot.requests.remaining == 0
    with pytest.raises(RateLimited):
        usage.take_request(limits, at(T0 + 5999))
    usage.take_request(limits, at(T0 + 6000))


def test_a_request_larger_than_the_token_limit_runs_from_a_full_bucket_then_others_wait() -> None:
    limits = ConsumerLimits(tokens_per_minute=1000)
    usage = ConsumerUsage()
    receipt = usage.reserve_tokens(limits, 1500, at(T0))
    assert receipt.snapshot.tokens == RateState(kind=LimitKind.TOKENS_PER_MINUTE, limit=1000, remaining=0,
                                                reset_seconds=90.0)  # 1500 tokens to refill at 1000/min
    with pytest.raises(RateLimited) as caught:
        usage.reserve_tokens(limits, 1, at(T0 + 29_999))  # the bucket is still below zero
    assert caught.value.retry_after == 1 and caught.value.limit is LimitKind.TOKENS_PER_MINUTE
    usage.reserve_tokens(limits, 1, at(T0 + 30_060))  # -500 + 501 tokens refilled: holds 1


def test_settle_refunds_and_charges_the_difference() -> None:
    limits = ConsumerLimits(tokens_per_minute=1000, tokens_per_day=5000)
    usage = ConsumerUsage()
    receipt = usage.reserve_tokens(limits, 800, at(T0))
    usage.settle(limits, receipt, 100, at(T0))
    assert usage.snapshot(limits, T0).tokens == RateState(
        kind=LimitKind.TOKENS_PER_MINUTE, limit=1000, remaining=900, reset_seconds=6.0)
    assert usage.used == 100
    second = usage.reserve_tokens(limits, 100, at(T0))
    usage.settle(limits, second, 1100, at(T0))  # used more than it estimated
    assert usage.tokens is not None and usage.tokens // 60_000 == -200 and usage.used == 1200


def test_the_day_window_resets_at_utc_midnight_and_a_past_day_is_not_charged_again() -> None:
    limits = ConsumerLimits(tokens_per_day=1000)
    usage = ConsumerUsage()
    late = T0 + DAY_MS - 10_000  # 23:59:50
    receipt = usage.reserve_tokens(limits, 900, at(late))
    assert receipt.snapshot.tokens == RateState(kind=LimitKind.TOKENS_PER_DAY, limit=1000, remaining=100,
                                                reset_seconds=10.0)
    with pytest.raises(RateLimited) as caught:
        usage.reserve_tokens(limits, 200, at(late + 500))
    assert caught.value.limit is LimitKind.TOKENS_PER_DAY and caught.value.retry_after == 10
    usage.reserve_tokens(limits, 100, at(late + 500))  # fits exactly
    usage.reserve_tokens(limits, 5000, at(T0 + DAY_MS))  # a new day: min(5000, limit) fits an empty window
    usage.settle(limits, receipt, 0, at(T0 + DAY_MS + 1))  # yesterday's refund: today unchanged
    assert usage.used == 5000


def test_every_token_limit_must_admit_and_a_token_refusal_takes_no_tokens() -> None:
    limits = ConsumerLimits(requests_per_minute=100, tokens_per_minute=1000, tokens_per_day=10_000)
    usage = ConsumerUsage()
    usage.take_request(limits, at(T0))
    usage.reserve_tokens(limits, 1000, at(T0))
    usage.take_request(limits, at(T0))  # the second request is counted at the door...
    before = (usage.requests, usage.tokens, usage.used)
    with pytest.raises(RateLimited) as caught:
        usage.reserve_tokens(limits, 10, at(T0))  # ...and refused for its tokens: it stays counted
    assert caught.value.limit is LimitKind.TOKENS_PER_MINUTE
    assert (usage.requests, usage.tokens, usage.used) == before
    snapshot = caught.value.snapshot
    assert snapshot.requests is not None and snapshot.requests.remaining == 98
    assert snapshot.tokens is not None and snapshot.tokens.kind is LimitKind.TOKENS_PER_MINUTE


def test_retry_after_is_the_longest_wait_of_the_violated_token_limits() -> None:
    limits = ConsumerLimits(tokens_per_minute=60, tokens_per_day=100)
    usage = ConsumerUsage()
    usage.reserve_tokens(limits, 60, at(T0 + DAY_MS - 120_000))  # 23:58
    with pytest.raises(RateLimited) as caught:
        usage.reserve_tokens(limits, 50, at(T0 + DAY_MS - 120_000))  # tokens: 50 s, the day: 120 s
    assert caught.value.limit is LimitKind.TOKENS_PER_DAY and caught.value.retry_after == 120


def test_taking_a_request_checks_no_token_limit() -> None:
    limits = ConsumerLimits(requests_per_minute=5, tokens_per_minute=10)
    usage = ConsumerUsage()
    usage.reserve_tokens(limits, 1000, at(T0))  # the token bucket is far below zero
    assert usage.take_request(limits, at(T0)).requests.remaining == 4  # type: ignore[union-attr]
    assert usage.request_refusal(limits, T0) is None and usage.token_refusal(limits, 0, T0) is not None


def test_idle_time_is_until_the_state_is_fresh() -> None:
    limits = ConsumerLimits(requests_per_minute=60, tokens_per_day=10)
    usage = ConsumerUsage()
    usage.take_request(limits, at(T0))
    usage.reserve_tokens(limits, 0, at(T0))
    assert usage.idle_ms(limits, T0) == 1000  # no tokens used today: the bucket alone
    usage.reserve_tokens(limits, 1, at(T0))
    assert usage.idle_ms(limits, T0) == DAY_MS


# -- the reference model --------------------------------------------------------------

class Model:
    """The limits as the brief states them, in exact fractions of a token and seconds."""

    def __init__(self, limits: ConsumerLimits) -> None:
        self.limits = limits
        self.r = Fraction(limits.requests_per_minute or 0)
        self.t = Fraction(limits.tokens_per_minute or 0)
        self.day, self.used, self.ms = -1, 0, 0

    def advance(self, ms: int) -> None:
        dt = Fraction(max(0, ms - self.ms), 1000)
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        if rpm:
            self.r = min(Fraction(rpm), self.r + dt * rpm / 60)
        if tpm:
            self.t = min(Fraction(tpm), self.t + dt * tpm / 60)
        self.ms = max(self.ms, ms)
        if ms // DAY_MS != self.day:
            self.day, self.used = ms // DAY_MS, 0

    def admits_request(self) -> bool:
        rpm = self.limits.requests_per_minute
        return not rpm or self.r >= 1

    def admits_tokens(self, tokens: int) -> bool:
        tpm, tpd = self.limits.tokens_per_minute, self.limits.tokens_per_day
        return (not tpm or self.t >= min(tokens, tpm)) and (not tpd or self.used + min(tokens, tpd) <= tpd)

    def take_request(self) -> None:
        self.r -= 1

    def take_tokens(self, tokens: int) -> None:
        self.t -= tokens
        self.used += tokens

    def settle(self, tokens: int, actual: int, day: int) -> None:
        if self.limits.tokens_per_minute:
            self.t = min(Fraction(self.limits.tokens_per_minute), self.t - (actual - tokens))
        if day == self.day:
            self.used = max(0, self.used + actual - tokens)


limit_values = st.one_of(st.none(), st.integers(1, 5000))


class RateLimitMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limits: ConsumerLimits | None = None
        self.usage = ConsumerUsage()
        self.ms = T0 - 5_000
        self.open: list[tuple[Receipt, int]] = []  # unsettled receipts and the model's day for them
        self.model: Model | None = None

    @precondition(lambda self: self.limits is None)
    @rule(rpm=limit_values, tpm=limit_values, tpd=st.one_of(st.none(), st.integers(1, 20_000)))
    def configure(self, rpm: int | None, tpm: int | None, tpd: int | None) -> None:
        self.limits = ConsumerLimits(requests_per_minute=rpm, tokens_per_minute=tpm, tokens_per_day=tpd)
        self.model = Model(self.limits)
        self.model.ms = self.ms

    @rule(ms=st.integers(0, 90_000))
    def wait(self, ms: int) -> None:
        self.ms += ms

    @precondition(lambda self: self.limits is not None)
    @rule()
    def request(self) -> None:
        assert self.limits is not None and self.model is not None
        self.model.advance(self.ms)
        expected = self.model.admits_request()
        try:
            self.usage.take_request(self.limits, at(self.ms))
        except RateLimited as refused:
            assert not expected
            self._check_retry(None, refused)
            return
        assert expected
        self.model.take_request()

    @precondition(lambda self: self.limits is not None)
    @rule(tokens=st.integers(0, 6000))
    def reserve(self, tokens: int) -> None:
        assert self.limits is not None and self.model is not None
        self.model.advance(self.ms)
        expected = self.model.admits_tokens(tokens)
        try:
            receipt = self.usage.reserve_tokens(self.limits, tokens, at(self.ms))
        except RateLimited as refused:
            assert not expected
            self._check_retry(tokens, refused)
            return
        assert expected
        self.model.take_tokens(tokens)
        self.open.append((receipt, self.model.day))

    @precondition(lambda self: self.open)
    @rule(data=st.data(), actual=st.integers(0, 6000))
    def settle(self, data: st.DataObject, actual: int) -> None:
        assert self.limits is not None and self.model is not None
        receipt, day = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        self.model.advance(self.ms)
        self.model.settle(receipt.tokens, actual, day)
        self.usage.settle(self.limits, receipt, actual, at(self.ms))

    @precondition(lambda self: self.open)
    @rule()
    def refund_restores(self) -> None:
        """A reservation settled at once with 0 tokens leaves every token limit as it was."""
        assert self.limits is not None
        probe = ConsumerUsage(self.usage.requests, self.usage.tokens, self.usage.stamp, self.usage.day,
                              self.usage.used)
        probe.advance(self.limits, self.ms)
        before = (probe.tokens, probe.used)
        try:
            receipt = probe.reserve_tokens(self.limits, 700, at(self.ms))
        except RateLimited:
            return
        probe.settle(self.limits, receipt, 0, at(self.ms))
        assert (probe.tokens, probe.used) == before

    @invariant()
    def agrees_with_the_model(self) -> None:
        if self.limits is None or self.model is None:
            return
        self.model.advance(self.ms)
        self.usage.advance(self.limits, self.ms)
        snap = self.usage.snapshot(self.limits, self.ms)
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        if rpm:
            assert snap.requests is not None and snap.requests.remaining == max(0, int(self.model.r // 1))
            assert self.model.r >= 0
        if tpm:
            assert Fraction(self.usage.tokens or 0, 60_000) == self.model.t
        if self.limits.tokens_per_day:
            assert self.usage.used == self.model.used

    @invariant()
    def full_again_exactly_at_the_reset(self) -> None:
        if self.limits is None:
            return
        snap = self.usage.snapshot(self.limits, self.ms)
        for state in (snap.requests, snap.tokens):
            if state is None or state.kind is LimitKind.TOKENS_PER_DAY:
                continue
            reset_ms = round(state.reset_seconds * 1000)
            later = ConsumerUsage(self.usage.requests, self.usage.tokens, self.usage.stamp)
            later.advance(self.limits, self.ms + reset_ms)
            again = later.snapshot(self.limits, self.ms + reset_ms)
            full = again.requests if state.kind is LimitKind.REQUESTS_PER_MINUTE else again.tokens
            assert full is not None and full.remaining == state.limit and full.reset_seconds == 0
            if reset_ms > 0:
                before = ConsumerUsage(self.usage.requests, self.usage.tokens, self.usage.stamp)
                before.advance(self.limits, self.ms + reset_ms - 1)
                level = before.requests if state.kind is LimitKind.REQUESTS_PER_MINUTE else before.tokens
                assert level is not None and level < state.limit * 60_000

    def _check_retry(self, tokens: int | None, refused: RateLimited) -> None:
        """Retry-After is when the request (`tokens` None) or the reservation fits (to the ms),
        if nothing else happens."""
        assert self.limits is not None
        limits = self.limits

        def refusal(usage: ConsumerUsage, ms: int) -> Refusal | None:
            return usage.request_refusal(limits, ms) if tokens is None else usage.token_refusal(limits, tokens, ms)

        usage = ConsumerUsage(self.usage.requests, self.usage.tokens, self.usage.stamp, self.usage.day,
                              self.usage.used)
        usage.advance(limits, self.ms)
        found = refusal(usage, self.ms)
        assert found is not None and found.limit is refused.limit
        assert refused.retry_after == max(1, -(-found.wait_ms // 1000))
        ready = ConsumerUsage(usage.requests, usage.tokens, usage.stamp, usage.day, usage.used)
        ready.advance(limits, self.ms + found.wait_ms)
        assert refusal(ready, self.ms + found.wait_ms) is None
        almost = ConsumerUsage(usage.requests, usage.tokens, usage.stamp, usage.day, usage.used)
        almost.advance(limits, self.ms + found.wait_ms - 1)
        assert refusal(almost, self.ms + found.wait_ms - 1) is not None


RateLimitMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRateLimitModel = RateLimitMachine.TestCase


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 3000),
       steps=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 4000)), min_size=1, max_size=60))
def test_no_window_ever_takes_more_than_the_limit_plus_one_reservation(
        limit: int, steps: list[tuple[int, int]]) -> None:
    """For every interval [a, b] of admissions: requests <= L + L*(b-a)/60 s, and tokens
    the same plus the largest reservation (the documented overshoot)."""
    limits = ConsumerLimits(requests_per_minute=limit, tokens_per_minute=limit)
    usage, ms, admitted = ConsumerUsage(), T0, []
    for dt, tokens in steps:
        ms += dt
        try:
            usage.take_request(limits, at(ms))
        except RateLimited:
            continue
        try:
            usage.reserve_tokens(limits, tokens, at(ms))
        except RateLimited:
            tokens = 0  # counted as a request, refused for its tokens
        admitted.append((ms, tokens))
    for i, (start, _) in enumerate(admitted):
        taken = 0
        for j in range(i, len(admitted)):
            end = admitted[j][0]
            taken += admitted[j][1]
            refill = Fraction(limit * (end - start), 60_000)
            assert j - i + 1 <= limit + refill
            assert taken <= limit + refill + max(t for _, t in admitted[i:j + 1])
