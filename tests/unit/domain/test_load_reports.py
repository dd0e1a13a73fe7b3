"""The pick's reading of a replica's own load: waiting > 0 or running >= its slots is no room,
while the report is fresh (3 intervals); stale or missing reports change nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.load_reports import STALE_INTERVALS, LoadReport, fresh, saturated, saturated_replicas


def test_waiting_or_all_slots_running_is_no_room() -> None:
    assert saturated(LoadReport(running=0, waiting=1, at=0.0), 0.5, 1.0, 4)  # over its real slots
    assert saturated(LoadReport(running=4, waiting=0, at=0.0), 0.5, 1.0, 4)  # full
    assert not saturated(LoadReport(running=3, waiting=0, at=0.0), 0.5, 1.0, 4)
    assert saturated_replicas({"a": LoadReport(running=9, waiting=0, at=0.0),
                               "b": LoadReport(running=0, waiting=0, at=0.0)}, 1.0, 1.0, 4) == {"a"}  # fmt: skip


def test_a_report_older_than_three_intervals_is_ignored() -> None:
    report = LoadReport(running=0, waiting=5, at=10.0)
    assert STALE_INTERVALS == 3 and fresh(report, 11.5, 0.5) and saturated(report, 11.5, 0.5, 4)
    assert not fresh(report, 11.51, 0.5) and not saturated(report, 11.51, 0.5, 4)  # fail static


@given(st.integers(0, 10), st.integers(0, 10), st.floats(0, 10), st.floats(0.1, 5), st.integers(1, 8))
def test_saturated_is_exactly_the_rule(running: int, waiting: int, age: float, interval: float, slots: int) -> None:
    report = LoadReport(running=running, waiting=waiting, at=100.0)
    expected = age <= 3 * interval and (waiting > 0 or running >= slots)
    assert saturated(report, 100.0 + age, interval, slots) is expected
