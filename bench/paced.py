"""The paced scenario and its capacity search: the workload a GPU produces.

A second stub paces its streams (`--chunk-delay 0.02`, 50 tokens/s, `--tokens 50`); direct,
a ceiling and a gateway of their own sit in front of it. The search steps the number of
concurrent streams (`STEPS`: 100, 200, ... 800); at each step every target still in the
search runs (in rotation): `/v1` stream on direct, the ceiling and the gateway, `/llm`
stream on the gateway. Each run: a warm-up of one answer per stream (every upstream
connection open), then `rounds` answers per stream, driven by bench/paced_client.py (one
process per 100 streams, on the load CPU).

A step passes for a target when every stream completed and its gap p99 is at most
direct's gap p99 at that step + `GAP_SLACK_MS`; a failed step is measured once more (a busy
machine fails a step now and then) and passes if that run does. A target's capacity is the
last step it passed; it leaves the search at its first failed step. If direct itself does
not complete every stream at a step, the load side (stub + client on one CPU) is the limit:
the search ends there and the capacities found are lower bounds.

Per run: completed streams, TTFT p50/p99, the steady-state gap between arrivals p50/p99/max
as the client sees them, the target's CPU seconds (and per 1,000 streamed tokens), and the
client's own event-loop lag and CPU (a client that stalls would be blamed on the target).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import drive
import peers
import targets as t

HERE = Path(__file__).resolve().parent
TOKENS, CHUNK_DELAY = 50, 0.02
STEPS = tuple(range(100, 801, 100))
MODES = {"full": (STEPS, 3), "quick": (STEPS, 2), "smoke": ((16,), 1)}  # stream counts, answers per stream
STREAMS_PER_CLIENT = 100  # one client process holds at most this many streams
GAP_SLACK_MS = 10.0  # a step passes with a gap p99 at most direct's + this
RETRIES = 1  # a failed step is measured this many more times
RUNS = [("/v1", "direct", drive.SCENARIOS[1]), ("/v1", "ceiling", drive.SCENARIOS[1]),
        ("/v1", "ours", drive.SCENARIOS[1]), ("/llm", "ours", drive.SCENARIOS[2])]
DIRECT = "/v1|direct"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def start(procs: t.Procs, load: set[int] | None, tcpus: set[int] | None, wanted: list[str],
          ) -> tuple[dict[str, t.Target], dict[str, str]]:
    stub = t.start_stub(procs, load, TOKENS, CHUNK_DELAY, name="paced-stub")
    up, missing = {"direct": stub}, {}
    starters = {"ceiling": peers.start_ceiling, "ours": t.start_gateway}
    for name, starter in starters.items():
        if name in wanted:
            try:
                up[name] = starter(procs, tcpus, stub.url, name=f"paced-{name}")
            except RuntimeError as exc:
                missing[name] = f"could not start: {exc}".replace("\n", " ")[:300]
    return up, missing


def drive_streams(url: str, body: bytes, streams: int, rounds: int, load: set[int] | None,
                  target_pids: list[int]) -> dict[str, Any]:
    """One bounded run: `streams` in all over one client process per 100, all sending at the
    same moment."""
    clients = max(1, math.ceil(streams / STREAMS_PER_CLIENT))
    start_at = time.time() + 1.0 + 0.2 * clients  # time for every client to open its connections first
    timeout = rounds * (TOKENS + 3) * CHUNK_DELAY * 4 + 10
    procs = []
    for i in range(clients):
        share = streams // clients + (1 if i < streams % clients else 0)
        argv = [sys.executable, str(HERE / "paced_client.py"), "--url", url, "--body", body.decode(),
                "--streams", str(share), "--rounds", str(rounds), "--start-at", str(start_at),
                "--timeout", str(timeout)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=drive._pinned(load)))
    before = t.cpu_ticks(target_pids)
    results, failures = [], []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout + 30)
            except subprocess.TimeoutExpired:  # its own timeout did not stop it: count it as failed
                proc.kill()
                out, err = proc.communicate()
            try:
                results.append(json.loads(out.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                failures.append(err[-300:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    cpu_s = (t.cpu_ticks(target_pids) - before) / t.CLK_TCK
    merged = {k: [v for r in results for v in r[k]] for k in ("ttft_ms", "gaps_ms", "lag_ms")}
    client_wall = max((r["wall_s"] for r in results), default=0.0)
    completed = sum(r["completed"] for r in results)
    return {
        "streams": streams * rounds, "completed": completed,
        "errors": sum(r["errors"] for r in results) + len(failures) * rounds, "client_failures": failures,
        "ttft_p50_ms": percentile(merged["ttft_ms"], 50), "ttft_p99_ms": percentile(merged["ttft_ms"], 99),
        "gap_p50_ms": percentile(merged["gaps_ms"], 50), "gap_p99_ms": percentile(merged["gaps_ms"], 99),
        "gap_max_ms": max(merged["gaps_ms"], default=None), "gaps": len(merged["gaps_ms"]),
        "cpu_s": cpu_s, "wall_s": client_wall, "tokens": streams * rounds * TOKENS,
        "cpu_s_per_1k_tokens": 1000 * cpu_s / (streams * rounds * TOKENS),
        "client_lag_p99_ms": percentile(merged["lag_ms"], 99), "client_lag_max_ms": max(merged["lag_ms"], default=None),
        "client_cpu_pct": max((100 * r["cpu_s"] / r["wall_s"] for r in results if r["wall_s"]), default=None),
        "clients": clients,
    }


def verdict(cell: dict[str, Any], direct: dict[str, Any] | None) -> tuple[bool, str]:
    """Did a run pass its step: every stream complete, gap p99 <= direct's + GAP_SLACK_MS."""
    if cell["completed"] < cell["streams"]:
        return False, f"{cell['streams'] - cell['completed']} incomplete"
    if direct is None or direct.get("gap_p99_ms") is None or cell.get("gap_p99_ms") is None:
        return False, "no reference"
    over = cell["gap_p99_ms"] - direct["gap_p99_ms"]
    if over > GAP_SLACK_MS:
        return False, f"gap p99 +{over:.1f} ms"
    return True, f"gap p99 {over:+.1f} ms"


def _run(target: t.Target, scenario: drive.Scenario, streams: int, rounds: int, mode: str, load: set[int] | None,
         stub_pids: list[int], budget: list[float]) -> dict[str, Any]:
    url = target.url + (drive.path_for(scenario, target.messages_path) or "")
    pids = sorted(set(target.pids() + stub_pids))
    if mode != "smoke":  # warm-up: every upstream connection open, then idle again
        drive_streams(url, scenario.body(), streams, 1, load, target.pids())
        t.settle(pids)
    if budget[0] > 0:
        budget[0] -= t.wait_quiet(pids, 25, min(10, budget[0]))
    background = t.Background(pids)
    cell = drive_streams(url, scenario.body(), streams, rounds, load, target.pids())
    cell["background_cpu_pct"] = background.percent()
    t.settle(pids)
    return cell


def measure(mode: str, procs: t.Procs, load: set[int] | None, tcpus: set[int] | None, wanted: list[str],
            quiet_budget: float) -> tuple[dict[str, Any], float]:
    """The capacity search. Returns its record and the quiet budget left:
    {"steps", "rounds", "runs": {"surface|target": [cell, ...]}, "capacity": {key: streams},
     "top": the search's last step, "load_limit": the step direct failed (or None),
     "unavailable": {key: why}}; every cell carries its "step", "attempt", "passed", "why"."""
    steps, rounds = MODES[mode]
    up, missing = start(procs, load, tcpus, wanted)
    record: dict[str, Any] = {"steps": list(steps), "rounds": rounds, "tokens": TOKENS, "chunk_delay_s": CHUNK_DELAY,
                              "gap_slack_ms": GAP_SLACK_MS, "runs": {}, "capacity": {}, "load_limit": None,
                              "unavailable": {}, "top": steps[-1]}
    active = []
    for surface, name, scenario in RUNS:
        key = f"{surface}|{name}"
        if name not in up:
            record["unavailable"][key] = missing.get(name, "not in --targets")
            continue
        target = up[name]
        ok, detail = drive.check(target.url + (drive.path_for(scenario, target.messages_path) or ""), scenario,
                                 target.headers)
        if not ok:
            record["unavailable"][key] = f"did not answer: {detail}"
            continue
        active.append((key, target, scenario))
        record["runs"][key], record["capacity"][key] = [], 0
    stub_pids = up["direct"].pids()
    budget = [quiet_budget]
    for index, streams in enumerate(steps):
        if not any(key != DIRECT for key, _, _ in active):
            break
        shift = index % len(active)
        cells: dict[str, dict[str, Any]] = {}
        for key, target, scenario in active[shift:] + active[:shift]:
            cells[key] = _run(target, scenario, streams, rounds, mode, load, stub_pids, budget)
            _log(key, streams, 1, cells[key])
        direct = cells.get(DIRECT)
        if direct is not None and direct["completed"] < direct["streams"]:
            record["load_limit"] = streams  # the stub + client could not carry this step
        still = []
        for key, target, scenario in active:
            cell, attempt = cells[key], 1
            cell["passed"], cell["why"] = (cell["completed"] == cell["streams"], "reference") if key == DIRECT \
                else verdict(cell, direct)
            while not cell["passed"] and key != DIRECT and record["load_limit"] is None and attempt <= RETRIES:
                record["runs"][key].append({**cell, "step": streams, "attempt": attempt})
                attempt += 1
                cell = _run(target, scenario, streams, rounds, mode, load, stub_pids, budget)
                cell["passed"], cell["why"] = verdict(cell, direct)
                _log(key, streams, attempt, cell)
            record["runs"][key].append({**cell, "step": streams, "attempt": attempt})
            if cell["passed"] and record["load_limit"] is None:
                record["capacity"][key] = streams
                still.append((key, target, scenario))
        if record["load_limit"] is not None:
            break
        active = still if any(key != DIRECT for key, _, _ in still) else []
        # direct stays in while anything else does (it is every step's reference)
    return record, budget[0]


def _log(key: str, streams: int, attempt: int, cell: dict[str, Any]) -> None:
    again = f" (again, {attempt})" if attempt > 1 else ""
    print(f"  paced {streams:>4} streams {key:<12}{again} {cell['completed']}/{cell['streams']}, gap p99 "
          f"{cell['gap_p99_ms'] or 0:.1f} ms, CPU {cell['cpu_s']:.2f} s ({cell['cpu_s_per_1k_tokens']:.4f} s/1k "
          f"tokens), client lag p99 {cell['client_lag_p99_ms'] or 0:.1f} ms, background CPU "
          f"{cell['background_cpu_pct']:.0f}%", flush=True)


def final(record: dict[str, Any], key: str, step: int) -> dict[str, Any] | None:
    """The run that decided `key` at `step` (its last attempt)."""
    found = [c for c in record["runs"].get(key, []) if c["step"] == step]
    return found[-1] if found else None


def comparison_step(record: dict[str, Any], surface: str) -> int:
    """Up to where the CPU per token of the gateway on `surface` and the ceiling compare
    (`pooled`): the highest step both passed (the same loads on both, neither saturated),
    else the first."""
    both = min(record["capacity"].get("/v1|ceiling", 0), record["capacity"].get(f"{surface}|ours", 0))
    return both or record["steps"][0]


def compared(record: dict[str, Any], key: str, step: int) -> list[dict[str, Any]]:
    """`key`'s deciding runs at every step up to `step`: the runs a CPU comparison pools."""
    return [c for s in record["steps"] if s <= step and (c := final(record, key, s)) is not None]


def pooled(record: dict[str, Any], key: str, step: int) -> dict[str, Any] | None:
    """`key`'s deciding runs at every step up to `step` (the steps both sides of a comparison
    passed), their CPU seconds and tokens summed: CPU per 1,000 tokens over all those streams,
    not one step's (one run moves by a third from one step to the next on this machine)."""
    wanted = [s for s in record["steps"] if s <= step]
    cells = [c for c in compared(record, key, step) if c.get("cpu_s_per_1k_tokens")]
    if not wanted or len(cells) != len(wanted):
        return None
    cpu_s = sum(c["cpu_s"] for c in cells)
    tokens = sum(c.get("tokens") or round(1000 * c["cpu_s"] / c["cpu_s_per_1k_tokens"]) for c in cells)  # older JSON
    return {"steps": wanted, "cpu_s": cpu_s, "tokens": tokens, "cpu_s_per_1k_tokens": 1000 * cpu_s / tokens}


def summary_cells(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One cell per surface|target at its surface's comparison step (the JSON's `paced`)."""
    cells: dict[str, dict[str, Any]] = {key: {"unavailable": why} for key, why in record["unavailable"].items()}
    for key in record["runs"]:
        surface = key.split("|")[0]
        cell = final(record, key, comparison_step(record, surface))
        if cell is not None:
            cells[key] = cell
    return cells
