"""bench/report.py: which round of a cell stands in the table (the wall-clock columns read it)."""

from __future__ import annotations


def _round(rps: float, background: float) -> dict[str, float]:
    return {"rps": rps, "background_cpu_pct": background, "ok": 1, "errors": 0}


def test_the_fastest_quiet_round_stands(report) -> None:  # type: ignore[no-untyped-def]
    cell = report.aggregate([_round(2167, 0.4), _round(1555, 0.2), _round(2100, 3.0)])
    assert cell["rps"] == 2167  # not the slow round that read 0.2% against 0.4%
    assert cell["rounds_rps"] == [2167, 1555, 2100] and cell["rounds"] == 3


def test_a_busy_round_never_stands_for_a_quiet_one(report) -> None:  # type: ignore[no-untyped-def]
    assert report.aggregate([_round(9000, 40.0), _round(2000, 1.0)])["rps"] == 2000


def test_with_no_quiet_round_the_least_busy_stands(report) -> None:  # type: ignore[no-untyped-def]
    assert report.aggregate([_round(3000, 30.0), _round(2500, 12.0), _round(2600, 12.0)])["rps"] == 2600
