"""bench/run's c64 per-request verdicts: judged by instructions per request, with the wall clock's
requests per second beside them, not judged."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

# ours/ceiling 0.879x, 0.800003x, /llm 0.745x (of the ceiling's /v1 stream); keyed/ours 0.849x, 0.912x, 0.913x
PER_REQUEST = {"v1|ceiling": 781_845, "v1|ours": 889_928, "v1|keyed": 1_048_041,
               "v1-stream|ceiling": 1_397_186, "v1-stream|ours": 1_746_476, "v1-stream|keyed": 1_914_150,
               "llm-stream|ours": 1_875_678, "llm-stream|keyed": 2_053_404}


def _cells() -> dict[str, dict[str, Any]]:
    # by req/s ours would miss every ratio: the verdicts must not read these
    rps = {"ceiling": 5000.0, "ours": 3000.0, "keyed": 2000.0}
    return {f"{scenario}|64|{name}": {"rps": value, "p50_ms": 1.0} for scenario in ("v1", "v1-stream", "llm-stream")
            for name, value in rps.items()}


def _lines(report: ModuleType, counts: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {line["target"]: line for line in report.checks(_cells(), {}, False, None, counts)}


def test_the_ratios_are_the_inverse_ratios_of_instructions(report: ModuleType) -> None:
    lines = _lines(report, {"per_request": PER_REQUEST, "unavailable": {}})
    v1 = lines["/v1 non-stream c64 ours/ceiling by instructions"]
    assert v1["measured"] == pytest.approx(781_845 / 889_928) and v1["status"] == "met"
    assert "ceiling 781,845, ours 889,928" in v1["text"]
    assert "wall clock, not judged: 0.60x by req/s" in v1["text"]
    llm = lines["/llm stream c64 ours/ceiling's /v1 stream by instructions"]
    assert llm["measured"] == pytest.approx(1_397_186 / 1_875_678) and llm["status"] == "met"
    stream = lines["/v1 stream c64 ours/ceiling by instructions"]
    assert stream["measured"] == pytest.approx(0.8, abs=1e-5) and stream["status"] == "met"  # on its line


def test_keyed_non_stream_is_held_to_085_and_the_streams_to_09(report: ModuleType) -> None:
    lines = _lines(report, {"per_request": PER_REQUEST, "unavailable": {}})
    v1 = lines["/v1 non-stream c64 keyed/ours (API keys + limits on / off) by instructions"]
    assert v1["bound"] == ">= 0.85x" and v1["status"] == "MISSED"  # 0.849x
    assert "wall clock, not judged: 0.67x by req/s" in v1["text"]
    stream = lines["/v1 stream c64 keyed/ours (API keys + limits on / off) by instructions"]
    assert stream["bound"] == ">= 0.9x" and stream["status"] == "met"
    per = dict(PER_REQUEST, **{"v1|keyed": 1_040_000})  # 0.856x: within the non-stream's room
    assert _lines(report, {"per_request": per, "unavailable": {}})[v1["target"]]["status"] == "met"


def test_without_counts_the_verdict_is_na_and_says_why(report: ModuleType) -> None:
    lines = _lines(report, None)
    v1 = lines["/v1 non-stream c64 ours/ceiling by instructions"]
    assert v1["status"] == "n/a" and "no instruction counts" in v1["text"] and "0.60x by req/s" in v1["text"]
    why = {"v1|keyed": "valgrind is not installed (bench/run installs it with apt-get)"}
    lines = _lines(report, {"per_request": {k: v for k, v in PER_REQUEST.items() if k != "v1|keyed"},
                            "unavailable": why})
    keyed = lines["/v1 non-stream c64 keyed/ours (API keys + limits on / off) by instructions"]
    assert keyed["status"] == "n/a" and "valgrind is not installed" in keyed["text"]


def test_the_table_prints_counts_and_both_ratios(instructions: ModuleType) -> None:
    text = instructions.table({"per_request": PER_REQUEST, "unavailable": {}, "requests": 1600, "concurrency": 64,
                               "warmup": 200})
    row = next(line for line in text.splitlines() if line.startswith("/v1 non-stream"))
    assert row.split() == ["/v1", "non-stream", "781,845", "889,928", "1,048,041", "0.879x", "0.849x"]
    assert "1,397,186*" in next(line for line in text.splitlines() if line.startswith("/llm stream"))
