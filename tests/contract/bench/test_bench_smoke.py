"""CI form of the benchmark harness (bench/harness.py --smoke): a few seconds of load on
loopback, asserting only that every target answered. No timed assertions: the figures
depend on the machine; bench/run measures them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NOT_INSTALLED = ("not installed", "is not installed")


def test_every_target_answers_under_a_short_load(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "harness.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "latest.json").read_text())

    # direct, the ceiling and ours always run; nginx and LiteLLM only where already installed.
    for name, why in record["unavailable"].items():
        assert name not in ("direct", "ceiling", "ours"), why
        assert any(text in why for text in NOT_INSTALLED), f"{name} is installed but did not start: {why}"
    started = {key.split("|")[1] for key in record["answered"]}
    assert {"direct", "ceiling", "ours"} <= started

    for key, detail in record["answered"].items():
        assert detail == "ok", f"{key}: {detail}"
    for key in record["answered"]:
        scenario, name = key.split("|")
        for c in record["concurrency"]:
            cell = record["cells"][f"{scenario}|{c}|{name}"]
            assert cell["ok"] > 0, f"{name} answered no {scenario} request under load: {cell}"
            assert cell["errors"] == 0, f"{name} {scenario}: {cell}"
    assert {"v1|ours", "v1-stream|ours", "llm-stream|ours", "v1|ceiling", "v1-stream|ceiling"} <= set(
        record["answered"])

    # The paced scenario, tiny: every stream of every target completed and was timed.
    assert set(record["paced"]) == {"/v1|direct", "/v1|ceiling", "/v1|ours", "/llm|ours"}
    for key, cell in record["paced"].items():
        assert cell["completed"] == cell["streams"] > 0 and cell["errors"] == 0, f"{key}: {cell}"
        assert cell["gap_p99_ms"] is not None and cell["ttft_p50_ms"] is not None, f"{key}: {cell}"
