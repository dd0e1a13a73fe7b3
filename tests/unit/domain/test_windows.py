"""CounterWindow: growth of cumulative counters over the last minute."""

from __future__ import annotations

from domain.windows import CounterWindow


def test_growth_over_the_last_span_from_readings_once_a_second() -> None:
    window: CounterWindow[str] = CounterWindow(span=60.0, resolution=1.0)
    for second in range(0, 200):
        window.add(float(second), {"a": float(second * 2), "b": 5.0})
    covered, grown = window.growth(200.0, {"a": 400.0, "b": 5.0, "c": 1.0})
    assert covered == 60.0
    assert grown == {"a": 120.0, "c": 1.0}  # b did not grow; c is new since the base reading


def test_just_after_start_the_window_is_what_there_is() -> None:
    window: CounterWindow[str] = CounterWindow()
    assert window.growth(5.0, {"a": 3.0}) == (0.0, {})
    window.add(10.0, {"a": 1.0})
    window.add(10.5, {"a": 2.0})  # within the resolution: not kept
    assert window.growth(25.0, {"a": 4.0}) == (15.0, {"a": 3.0})


def test_readings_no_longer_needed_are_forgotten() -> None:
    window: CounterWindow[str] = CounterWindow(span=10.0, resolution=1.0)
    for second in range(1000):
        window.add(float(second), {"a": float(second)})
    assert len(window._readings) <= 12
    assert window.growth(1000.0, {"a": 1000.0}) == (10.0, {"a": 10.0})
