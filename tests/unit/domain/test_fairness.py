"""Shares of an upstream and Jain's fairness index over a sliding window (`domain.fairness`,
fed by `domain.windows.CounterWindow` as the status board feeds it)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from domain.fairness import Use, jain_index, shares, weighted_tokens
from domain.windows import CounterWindow


def test_jain_index_from_equal_to_one_consumer_taking_everything() -> None:
    assert jain_index([5.0, 5.0, 5.0]) == 1.0
    assert jain_index([9.0, 0.0, 0.0]) == 1 / 3  # one of three got all: 1/n
    assert math.isclose(jain_index([1.0, 2.0, 3.0]), 36 / 42)  # (1+2+3)^2 / (3 x (1+4+9))
    assert jain_index([7.0]) == 1.0 and jain_index([]) == 1.0  # fewer than 2: nobody was favoured
    assert jain_index([0.0, 0.0]) == 1.0  # all waited, none was served: equal


@given(st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=2, max_size=40),
       st.floats(min_value=1e-3, max_value=1e3))
def test_jain_index_is_between_1_over_n_and_1_and_does_not_depend_on_the_unit(
    values: list[float], scale: float
) -> None:
    index = jain_index(values)
    assert 1 / len(values) - 1e-9 <= index <= 1.0
    if sum(values) > 1e-6:
        assert math.isclose(index, jain_index([v * scale for v in values]), rel_tol=1e-6)


def test_output_tokens_weigh_twice_by_default() -> None:
    use = Use(input_tokens=100, output_tokens=10, cached_tokens=80)
    assert weighted_tokens(use) == 120 and weighted_tokens(use, 4.0) == 140  # cached is a part of input


def test_shares_of_slot_time_and_weighted_tokens_and_service_per_weight() -> None:
    uses = {"batch": Use(input_tokens=300, output_tokens=300, slot_seconds=9.0),
            "chat": Use(input_tokens=100, output_tokens=100, slot_seconds=3.0)}
    listed, index = shares(uses, {"batch": 3})
    batch, chat = listed
    assert (batch.consumer, chat.consumer) == ("batch", "chat")
    assert (batch.weighted_tokens, chat.weighted_tokens) == (900, 300)
    assert (batch.token_share, chat.token_share) == (0.75, 0.25) and (batch.slot_share, chat.slot_share) == (0.75, 0.25)
    assert (batch.service, chat.service) == (300, 300)  # weight 3 got 3x: as entitled
    assert index == 1.0
    _, unweighted = shares(uses, {})
    assert math.isclose(unweighted, (900 + 300) ** 2 / (2 * (900**2 + 300**2)))  # 0.8


def test_a_consumer_that_only_waited_counts_as_served_nothing() -> None:
    listed, index = shares({"a": Use(input_tokens=50, output_tokens=25, slot_seconds=2.0), "b": Use()}, {})
    assert [(s.consumer, s.token_share, s.slot_share) for s in listed] == [("a", 1.0, 1.0), ("b", 0.0, 0.0)]
    assert index == 0.5
    nothing, idle = shares({"a": Use(), "b": Use()}, {})
    assert idle == 1.0 and all(s.token_share == 0 and s.slot_share == 0 for s in nothing)


def _uses(grown: dict[tuple[str, str], float]) -> dict[str, Use]:
    """The window's growth of ("tokens" | "slots", consumer) counters as uses (the board's job)."""
    out: dict[str, Use] = {}
    for (what, consumer), value in grown.items():
        use = out.setdefault(consumer, Use())
        if what == "tokens":
            use.input_tokens = value
        else:
            use.slot_seconds = value
    return out


def test_over_a_sliding_minute_old_use_ages_out() -> None:
    """Cumulative counters read once a second: a minute after a consumer stopped, its use has
    left the window, and the index sees only who is served now."""
    window: CounterWindow[tuple[str, str]] = CounterWindow(span=60.0, resolution=1.0)
    totals = {("tokens", "a"): 0.0, ("tokens", "b"): 0.0, ("slots", "a"): 0.0, ("slots", "b"): 0.0}

    def second(t: int, a: float, b: float) -> tuple[list[str], float, dict[str, float]]:
        totals["tokens", "a"] += a
        totals["slots", "a"] += a / 100
        totals["tokens", "b"] += b
        totals["slots", "b"] += b / 100
        window.add(float(t), totals)
        _, grown = window.growth(float(t), totals)
        listed, index = shares(_uses(grown), {})
        return [s.consumer for s in listed], index, {s.consumer: s.slot_share for s in listed}

    for t in range(60):  # a minute of both, served alike
        names, index, slot = second(t, 100, 100)
    assert names == ["a", "b"] and index == 1.0 and slot == {"a": 0.5, "b": 0.5}
    for t in range(60, 90):  # then only a: b's share shrinks as its minute slides out
        names, index, slot = second(t, 100, 0)
    # the window (seconds 30..89): a 60 x 100, b 30 x 100
    assert names == ["a", "b"] and math.isclose(slot["a"], 2 / 3) and math.isclose(index, 0.9)
    for t in range(90, 125):
        names, index, slot = second(t, 100, 0)
    assert names == ["a"] and index == 1.0 and slot == {"a": 1.0}  # b left the window
