"""bench/fairness.py's verdicts, from given counts: `tokens` within 0.8..1.25 of the weight ratio in
weighted service, `fair` equal requests and A far more tokens, metering exactly equal."""

from __future__ import annotations

from types import ModuleType


def _row(fairness: ModuleType, kind: str, weights: tuple[int, int], a: tuple[float, float, float],
         b: tuple[float, float, float], generated: tuple[int, int] | None = None) -> object:
    """A measured row: (requests, input, output) of A and B in the window; the stub generated
    what the gateways counted unless `generated` says otherwise."""
    use = fairness.rig.Use
    row = fairness.Row("r", kind, 1, {"A": weights[0], "B": weights[1]})
    row.window = {"A": use(a[0], a[1], a[2]), "B": use(b[0], b[1], b[2])}
    row.counted = {"A": a[2], "B": b[2]}
    row.started = {"A": int(a[0]), "B": int(b[0])}
    row.generated = dict(zip("AB", generated, strict=True)) if generated else {"A": int(a[2]), "B": int(b[2])}
    return row


def test_tokens_is_met_within_a_fifth_of_the_weight_ratio(fairness: ModuleType) -> None:
    even = _row(fairness, "tokens", (1, 1), (10, 40, 4000), (200, 800, 4000))  # 8040 against 8800
    assert [met for met, _ in fairness.verdicts(even)] == [True, True]
    two_to_one = _row(fairness, "tokens", (2, 1), (20, 80, 8000), (200, 800, 4000))  # 16080 / 8800 / 2
    assert fairness.verdicts(two_to_one)[0][0]
    lopsided = _row(fairness, "tokens", (1, 1), (20, 80, 8000), (200, 800, 4000))
    assert not fairness.verdicts(lopsided)[0][0]
    assert "1.83" in fairness.verdicts(lopsided)[0][1]


def test_fair_needs_equal_requests_and_gives_a_far_more_tokens(fairness: ModuleType) -> None:
    assert fairness.verdicts(_row(fairness, "fair", (1, 1), (20, 80, 8000), (21, 84, 420)))[0][0]
    assert not fairness.verdicts(_row(fairness, "fair", (1, 1), (10, 40, 4000), (20, 80, 400)))[0][0]
    assert not fairness.verdicts(_row(fairness, "fair", (1, 1), (20, 80, 400), (20, 80, 400)))[0][0]


def test_metering_must_be_exact(fairness: ModuleType) -> None:
    off = _row(fairness, "tokens", (1, 1), (10, 40, 4000), (200, 800, 4000), generated=(4000, 3980))
    met, text = fairness.verdicts(off)[1]
    assert not met and "!=" in text
