"""bench/run's paced CPU verdict: CPU per 1,000 tokens pooled over every step both sides passed."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest


def _run(step: int, cpu_s: float) -> dict[str, Any]:
    tokens = step * 3 * 50
    return {"step": step, "cpu_s": cpu_s, "tokens": tokens, "cpu_s_per_1k_tokens": 1000 * cpu_s / tokens}


def _record() -> dict[str, Any]:
    return {
        "steps": [100, 200, 300, 400], "top": 400, "load_limit": None, "unavailable": {},
        "capacity": {"/v1|ceiling": 300, "/v1|ours": 300, "/llm|ours": 200},
        "runs": {
            "/v1|ceiling": [_run(100, 0.4), _run(200, 1.0), _run(300, 1.5), _run(400, 2.4)],
            # 300 passed on its second try: that run decides; 400 failed (not a step both passed)
            "/v1|ours": [_run(100, 0.6), _run(200, 1.3), _run(300, 3.0), _run(300, 1.9), _run(400, 2.0)],
            "/llm|ours": [_run(100, 0.7), _run(200, 1.4), _run(300, 2.5)],
        },
    }


def test_the_cpu_of_every_step_both_passed_is_summed(paced: ModuleType) -> None:
    record = _record()
    mine = paced.pooled(record, "/v1|ours", paced.comparison_step(record, "/v1"))
    assert mine["steps"] == [100, 200, 300]
    assert mine["cpu_s"] == pytest.approx(0.6 + 1.3 + 1.9)  # the deciding (last) run at 300
    assert mine["tokens"] == (100 + 200 + 300) * 150
    assert mine["cpu_s_per_1k_tokens"] == pytest.approx(1000 * 3.8 / 90_000)
    assert paced.pooled(record, "/v1|ours", 100)["cpu_s"] == pytest.approx(0.6)
    assert paced.pooled(record, "/nowhere|ours", 300) is None


def test_the_verdict_is_the_pooled_ratio_and_names_the_top_step_alone(report: ModuleType, paced: ModuleType) -> None:
    targets = report.Targets()
    report.capacity_checks(targets, _record())
    lines = {line["target"]: line for line in targets.out}
    v1 = lines["paced CPU per 1,000 tokens /v1 ours/ceiling's /v1"]
    # 1.31x over the three steps, though the top step alone is 1.27x: the sum decides, not one step
    assert v1["measured"] == pytest.approx((0.6 + 1.3 + 1.9) / (0.4 + 1.0 + 1.5))
    assert v1["status"] == "MISSED"
    assert "100-300 streams" in v1["text"] and "at 300 streams alone 1.27x" in v1["text"]
    llm = lines["paced CPU per 1,000 tokens /llm ours/ceiling's /v1"]  # /llm passed 200: compared up to 200
    assert llm["measured"] == pytest.approx((0.7 + 1.4) / (0.4 + 1.0))  # 1.5x (200 alone: 1.4x)
    assert llm["status"] == "met"
    assert "100-200 streams" in llm["text"]


def test_the_compared_runs_are_each_steps_deciding_one(paced: ModuleType) -> None:
    record = _record()
    runs = paced.compared(record, "/v1|ours", 300)
    assert [(c["step"], c["cpu_s"]) for c in runs] == [(100, 0.6), (200, 1.3), (300, 1.9)]  # not the failed 3.0
    assert paced.compared(record, "/llm|ours", 400) == record["runs"]["/llm|ours"]  # it has no run at 400
