"""The tables (load and paced), the issue-14 targets as met / missed by how much, and the JSON
record of a harness run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

TARGET_ORDER = ["direct", "nginx", "ceiling", "ours", "keyed", "litellm"]
# Targets with no Messages API: their /v1 stream stands in /llm comparisons.
NO_MESSAGES = ("direct", "nginx", "ceiling")
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
    """ours over each other target for one row. /llm compares to the /v1 stream of the targets
    without a Messages API (direct, nginx, ceiling) and to LiteLLM's /v1/messages."""
    ours = cells.get(f"{scenario}|{c}|ours")
    base = "v1-stream" if scenario == "llm-stream" else scenario
    out = {name: _ratio(ours, cells.get(f"{base}|{c}|{name}")) for name in NO_MESSAGES}
    out["litellm"] = _ratio(ours, cells.get(f"{scenario}|{c}|litellm"))
    return out


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def table(cells: dict[str, Cell], scenarios: list[tuple[str, str]], concurrency: list[int]) -> str:
    head = (f"{'scenario':<15}{'c':>4}  {'target':<12}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'TTFT p50':>10}"
            f"{'errors':>8}{'bg%':>5}{'ours/ceiling':>14}{'ours/direct':>13}{'ours/nginx':>12}{'ours/LiteLLM':>14}")
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
                    + (f"{_num(r['ceiling'], '{:.2f}x'):>14}{_num(r['direct'], '{:.2f}x'):>13}"
                       f"{_num(r['nginx'], '{:.2f}x'):>12}"
                       f"{_num(r['litellm'], '{:.1f}x'):>14}" if r else "")
                )
            lines.append("")
    return "\n".join(lines).rstrip()


class Targets:
    """The targets, each `met`, `MISSED` by how much, or `n/a` (a side is missing)."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []

    def add(self, name: str, value: float | None, op: str, bound: float, unit: str = "x", note: str = "") -> None:
        if value is None:
            status, how = "n/a", ""
        elif value >= bound if op == ">=" else value <= bound:
            status, how = "met", ""
        else:
            gap = bound - value if op == ">=" else value - bound
            status = "MISSED"
            how = f"; {'short' if op == '>=' else 'over'} by {gap:.3g}{unit}"
            how += f" ({100 * gap / bound:.0f}%)" if bound else ""
        shown = "n/a" if value is None else f"{value:.0f}{unit}" if abs(value) >= 100 else f"{value:.3g}{unit}"
        self.out.append({"target": name, "measured": value, "bound": f"{op} {bound}{unit}", "status": status,
                         "text": f"{status:<6} {name}: {shown} (target {op} {bound}{unit}{how}){note}"})


def checks(cells: dict[str, Cell], rss: dict[str, float | None], runtime_venv: bool,
           paced: dict[str, Cell] | None = None) -> list[dict[str, Any]]:
    """The issue's targets, all computed from this run (issue 14 item 6)."""
    targets = Targets()
    v1, v1s, llm = ratios(cells, "v1", 64), ratios(cells, "v1-stream", 64), ratios(cells, "llm-stream", 64)
    targets.add("/v1 non-stream c64 ours/ceiling", v1["ceiling"], ">=", 0.8)
    targets.add("/v1 stream c64 ours/ceiling", v1s["ceiling"], ">=", 0.8)
    targets.add("/llm stream c64 ours/ceiling /v1 stream", llm["ceiling"], ">=", 0.6)
    targets.add("/v1 non-stream c64 ours/LiteLLM", v1["litellm"], ">=", 20)
    targets.add("/v1 stream c64 ours/LiteLLM", v1s["litellm"], ">=", 40)
    targets.add("/llm stream c64 ours/LiteLLM /v1/messages", llm["litellm"], ">=", 40)
    for scenario, label in (("v1", "/v1 non-stream"), ("v1-stream", "/v1 stream"), ("llm-stream", "/llm stream")):
        keyed = _ratio(cells.get(f"{scenario}|64|keyed"), cells.get(f"{scenario}|64|ours"))
        targets.add(f"{label} c64 keyed/ours (API key + limits, issue 15)", keyed, ">=", 0.9)
    ours1, direct1 = cells.get("v1|1|ours"), cells.get("v1|1|direct")
    added = None
    if ours1 and direct1 and ours1.get("p50_ms") is not None and direct1.get("p50_ms") is not None:
        added = ours1["p50_ms"] - direct1["p50_ms"]
    targets.add("added p50 at c1 over direct (/v1 non-stream)", added, "<=", 0.3, " ms")
    targets.add("gateway peak RSS under load", rss.get("ours") if runtime_venv else None, "<=", 64, " MB",
                "" if runtime_venv else " (the gateway did not run on the runtime venv: bench/run builds it)")
    if paced is not None:
        paced_checks(targets, paced)
    # Not a target: if the stub is not well ahead of the gateway, the ratios above say nothing.
    direct_over_ours = [1 / r for r in (v1["direct"], v1s["direct"]) if r]
    targets.add("sanity: direct/ours at c64 (/v1, lower of non-stream and stream)",
                min(direct_over_ours) if direct_over_ours else None, ">=", 2)
    return targets.out


def paced_checks(targets: Targets, paced: dict[str, Cell]) -> None:
    direct, ceiling = paced.get("/v1|direct") or {}, paced.get("/v1|ceiling") or {}
    for surface in ("/v1", "/llm"):
        ours = paced.get(f"{surface}|ours") or {}
        missing = ours["streams"] - ours["completed"] if "streams" in ours else None
        targets.add(f"paced {surface}: streams that did not complete", missing, "<=", 0, "")
        gap = None
        if ours.get("gap_p99_ms") is not None and direct.get("gap_p99_ms") is not None:
            gap = ours["gap_p99_ms"] - direct["gap_p99_ms"]
        targets.add(f"paced {surface}: gateway p99 gap over direct's", gap, "<=", 10, " ms")
        cpu = ours["cpu_s"] / ceiling["cpu_s"] if ours.get("cpu_s") and ceiling.get("cpu_s") else None
        targets.add(f"paced {surface}: gateway CPU / ceiling's (/v1)", cpu, "<=", 1.6)
    lags = [c["client_lag_p99_ms"] for c in paced.values() if c.get("client_lag_p99_ms") is not None]
    targets.add("sanity: paced client event-loop lag p99, worst run (else the client stalled, not the target)",
                max(lags) if lags else None, "<=", 2, " ms")


def paced_table(paced: dict[str, Cell], streams: int, rounds: int, tokens: int, delay: float) -> str:
    head = (f"{'surface':<8}{'target':<10}{'completed':>11}{'TTFT p50':>10}{'TTFT p99':>10}{'gap p50':>9}"
            f"{'gap p99':>9}{'gap max':>9}{'CPU s':>8}{'x ceiling':>11}{'client lag p99':>16}{'client CPU%':>13}"
            f"{'bg%':>5}")
    lines = [f"paced: stub --chunk-delay {delay:g} --tokens {tokens}, {streams} concurrent streams x {rounds} "
             "answer(s) each; times in ms (gap: between arrivals after the first token)", head, "-" * len(head)]
    ceiling_cpu = (paced.get("/v1|ceiling") or {}).get("cpu_s")
    for key, cell in paced.items():
        surface, target = key.split("|")
        if cell.get("unavailable"):
            lines.append(f"{surface:<8}{target:<10}{'n/a':>11}  ({cell['unavailable']})"[:150])
            continue
        vs = cell["cpu_s"] / ceiling_cpu if ceiling_cpu and target == "ours" else None
        lines.append(
            f"{surface:<8}{target:<10}{cell['completed']:>5}/{cell['streams']:<5}"
            f"{_num(cell['ttft_p50_ms'], '{:.1f}'):>10}"
            f"{_num(cell['ttft_p99_ms'], '{:.1f}'):>10}{_num(cell['gap_p50_ms'], '{:.1f}'):>9}"
            f"{_num(cell['gap_p99_ms'], '{:.1f}'):>9}{_num(cell['gap_max_ms'], '{:.1f}'):>9}"
            f"{cell['cpu_s']:>8.2f}{_num(vs, '{:.2f}x'):>11}{_num(cell['client_lag_p99_ms'], '{:.2f}'):>16}"
            f"{_num(cell['client_cpu_pct'], '{:.0f}'):>13}{_num(cell.get('background_cpu_pct'), '{:.0f}'):>5}"
        )
    return "\n".join(lines)


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
