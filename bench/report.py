"""The one table, the issue-8 targets as PASS/FAIL, and the JSON record of a harness run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

TARGET_ORDER = ["direct", "nginx", "passthrough", "ours", "litellm"]
Cell = dict[str, Any]


def aggregate(runs: list[Cell]) -> Cell:
    """Several rounds of one (scenario, concurrency, target): the round measured while the
    rest of the machine was quietest (lowest background CPU) stands for the cell."""
    best = min(runs, key=lambda r: (r.get("background_cpu_pct") or 0.0, -(r.get("rps") or 0.0)))
    return {
        "rps": best.get("rps"), "p50_ms": best.get("p50_ms"), "p99_ms": best.get("p99_ms"),
        "ttft_p50_ms": best.get("ttft_p50_ms"), "ok": int(best.get("ok", 0)), "errors": int(best.get("errors", 0)),
        "background_cpu_pct": best.get("background_cpu_pct"), "driver": best.get("driver"),
        "ttft_driver": best.get("ttft_driver"), "rounds": len(runs),
        "rounds_rps": [r.get("rps") for r in runs],
        "rounds_background_cpu_pct": [r.get("background_cpu_pct") for r in runs],
    }


def _ratio(ours: Cell | None, other: Cell | None) -> float | None:
    if not ours or not other or not other.get("rps") or ours.get("rps") is None:
        return None
    return float(ours["rps"]) / float(other["rps"])


def ratios(cells: dict[str, Cell], scenario: str, c: int) -> dict[str, float | None]:
    """ours/direct, ours/nginx, ours/litellm for one row. /llm compares to the others' /v1
    stream (direct and nginx have no Messages API) and to LiteLLM's /v1/messages."""
    ours = cells.get(f"{scenario}|{c}|ours")
    base = "v1-stream" if scenario == "llm-stream" else scenario
    return {
        "direct": _ratio(ours, cells.get(f"{base}|{c}|direct")),
        "nginx": _ratio(ours, cells.get(f"{base}|{c}|nginx")),
        "litellm": _ratio(ours, cells.get(f"{scenario}|{c}|litellm")),
    }


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def table(cells: dict[str, Cell], scenarios: list[tuple[str, str]], concurrency: list[int]) -> str:
    head = (f"{'scenario':<15}{'c':>4}  {'target':<12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'TTFT p50':>10}"
            f"{'errors':>8}{'bg%':>5}{'ours/direct':>13}{'ours/nginx':>12}{'ours/LiteLLM':>14}")
    lines = [head, "-" * len(head)]
    for key, label in scenarios:
        for c in concurrency:
            for target in TARGET_ORDER:
                cell = cells.get(f"{key}|{c}|{target}")
                if cell is None:
                    continue
                if cell.get("unavailable"):
                    row = f"{label:<15}{c:>4}  {target:<12}{'n/a':>10}  ({cell['unavailable']})"
                    lines.append(row[:150])
                    continue
                r = ratios(cells, key, c) if target == "ours" else {}
                ttft = _num(cell.get("ttft_p50_ms"), "{:.2f}") if key != "v1" else "-"
                lines.append(
                    f"{label:<15}{c:>4}  {target:<12}{_num(cell['rps'], '{:.0f}'):>10}{_num(cell['p50_ms']):>9}"
                    f"{_num(cell['p99_ms']):>9}{ttft:>10}{cell['errors']:>8}"
                    f"{_num(cell.get('background_cpu_pct'), '{:.0f}'):>5}"
                    + (f"{_num(r['direct'], '{:.2f}x'):>13}{_num(r['nginx'], '{:.2f}x'):>12}"
                       f"{_num(r['litellm'], '{:.1f}x'):>14}" if r else "")
                )
            lines.append("")
    return "\n".join(lines).rstrip()


def checks(cells: dict[str, Cell], rss: dict[str, float | None]) -> list[dict[str, Any]]:
    """The issue's targets, measured in this run; n/a when a side of a ratio is missing."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, op: str, bound: float, unit: str = "x") -> None:
        status = "n/a" if value is None else ("PASS" if (value >= bound if op == ">=" else value <= bound)
                                              else "FAIL")
        shown = "n/a" if value is None else f"{value:.3g}{unit}"
        out.append({"target": name, "measured": value, "bound": f"{op} {bound}{unit}", "status": status,
                    "text": f"{status:<5} {name}: {shown} (target {op} {bound}{unit})"})

    r64 = ratios(cells, "v1", 64)
    add("/v1 non-stream c64 ours/LiteLLM", r64["litellm"], ">=", 50)
    add("/v1 non-stream c64 ours/nginx", r64["nginx"], ">=", 0.3)
    add("/v1 stream c64 ours/nginx", ratios(cells, "v1-stream", 64)["nginx"], ">=", 0.8)
    llm = ratios(cells, "llm-stream", 64)
    add("/llm stream c64 ours/LiteLLM /v1/messages", llm["litellm"], ">=", 40)
    add("/llm stream c64 ours/nginx /v1 stream", llm["nginx"], ">=", 0.4)
    ours1, direct1 = cells.get("v1|1|ours"), cells.get("v1|1|direct")
    added = None
    if ours1 and direct1 and ours1.get("p50_ms") is not None and direct1.get("p50_ms") is not None:
        added = ours1["p50_ms"] - direct1["p50_ms"]
    add("added p50 at c1 over direct (/v1 non-stream)", added, "<=", 0.2, " ms")
    add("gateway peak RSS under load", rss.get("ours"), "<=", 60, " MB")
    direct_over_ours = [1 / r for r in (r64["direct"], ratios(cells, "v1-stream", 64)["direct"]) if r]
    add("direct/ours at c64 (/v1, lower of non-stream and stream)",
        min(direct_over_ours) if direct_over_ours else None, ">=", 2)
    return out


def machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "kernel": platform.release(), "commit": commit}


def write_json(out_dir: Path, record: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(record, indent=2, sort_keys=True)
    path.write_text(text)
    (out_dir / "latest.json").write_text(text)
    return path
