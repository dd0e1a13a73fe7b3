"""The pick's reading of a replica's own load: requests waiting for room (vLLM's
`reason="capacity"`) or running >= its slots is no room, while the report is fresh (2
intervals); deferred waiters, stale or missing reports change nothing, and a stale report is
not kept (`LoadBook`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.load_reports import (
    FRESH_INTERVALS,
    LoadBook,
    LoadReport,
    fresh,
    saturated,
    saturated_replicas,
    window,
)


def test_waiting_for_room_or_all_slots_running_is_no_room() -> None:
    assert saturated(LoadReport(running=0, waiting=1, at=0.0), 0.5, 1.0, 4)  # over its real slots
    assert saturated(LoadReport(running=4, waiting=0, at=0.0), 0.5, 1.0, 4)  # full
    assert not saturated(LoadReport(running=3, waiting=0, at=0.0), 0.5, 1.0, 4)
    assert saturated_replicas({"a": LoadReport(running=9, waiting=0, at=0.0),
                               "b": LoadReport(running=0, waiting=0, at=0.0)}, 1.0, 1.0, 4) == {"a"}  # fmt: skip


def test_requests_deferred_for_their_own_reason_leave_the_replica_its_room() -> None:
    """vLLM 0.32 splits waiting: "deferred" ones wait for a grammar, a LoRA adapter or a KV
    transfer, not for a slot; only the others ("capacity") mean the replica is queueing."""
    deferred = LoadReport(running=1, waiting=3, deferred=3, at=0.0)
    assert deferred.queued == 0 and not saturated(deferred, 0.5, 1.0, 4)
    mixed = LoadReport(running=1, waiting=3, deferred=2, at=0.0)
    assert mixed.queued == 1 and saturated(mixed, 0.5, 1.0, 4)
    assert LoadReport(running=0, waiting=2, at=0.0).queued == 2  # a vLLM without the split: all of it
    assert LoadReport(running=0, waiting=1, deferred=5, at=0.0).queued == 0  # torn read: never negative


def test_a_report_counts_for_two_intervals_then_no_longer() -> None:
    report = LoadReport(running=0, waiting=5, at=10.0)
    assert FRESH_INTERVALS == 2 and window(0.5) == 1.0
    assert fresh(report, 10.99, 0.5) and saturated(report, 10.99, 0.5, 4)
    assert not fresh(report, 11.0, 0.5) and not saturated(report, 11.0, 0.5, 4)  # fail static


@given(st.integers(0, 10), st.integers(0, 10), st.integers(0, 10), st.floats(0, 10), st.floats(0.1, 5),
       st.integers(1, 8))  # fmt: skip
def test_saturated_is_exactly_the_rule(
    running: int, waiting: int, deferred: int, age: float, interval: float, slots: int
) -> None:
    report = LoadReport(running=running, waiting=waiting, deferred=deferred, at=100.0)
    expected = (100.0 + age) - 100.0 < 2 * interval and (waiting > deferred or running >= slots)
    assert saturated(report, 100.0 + age, interval, slots) is expected


def test_the_book_keeps_a_report_only_while_it_is_fresh() -> None:
    book = LoadBook(interval=1.0)
    book.follow(["a", "b"])
    book.record("a", LoadReport(running=0, waiting=16, at=5.0))
    book.record("b", LoadReport(running=1, waiting=0, at=5.5))
    assert book.next_expiry() == 7.0
    assert set(book.fresh(6.9)) == {"a", "b"}
    assert set(book.fresh(7.0)) == {"b"}  # the old "waiting 16" is gone, whatever the reads do now
    assert book.next_expiry() == 7.5
    assert not book.expire(7.4) and book.expire(7.5) and book.fresh(7.5) == {}
    assert book.next_expiry() is None
    assert book.read_at() == {"a": 5.0, "b": 5.5}  # when each was last read well: the age gauge


def test_a_newer_report_replaces_the_old_and_a_replica_that_left_is_forgotten() -> None:
    book = LoadBook(interval=1.0)
    book.follow(["a", "b"])
    book.record("a", LoadReport(running=0, waiting=16, at=5.0))
    book.record("a", LoadReport(running=0, waiting=0, at=6.0))
    assert book.fresh(7.5) == {"a": LoadReport(running=0, waiting=0, at=6.0)}
    book.follow(["b"])
    book.record("a", LoadReport(running=0, waiting=3, at=7.6))  # read while it left: not kept
    assert book.fresh(7.6) == {} and book.read_at() == {}
    book.record("b", LoadReport(running=0, waiting=3, at=7.6))
    book.forget("b")  # it answered 404: no load to read
    assert book.fresh(7.6) == {} and book.read_at() == {}
