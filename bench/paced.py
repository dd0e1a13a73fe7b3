"""The paced scenario (issue 14 item 6): the workload a GPU produces, not a loopback flood.

A second stub paces its streams (`--chunk-delay 0.02`, 50 tokens/s, `--tokens 50`); direct,
a ceiling and a gateway of their own sit in front of it. For each surface (`/v1` stream on
all three, `/llm` stream on the gateway) `STREAMS` concurrent streams run `rounds` answers
each, driven by bench/paced_client.py in `CLIENTS` processes on the load CPU. Per run: the
completed streams, TTFT p50/p99, the steady-state gap between arrivals p50/p99 as the client
sees them, the target's CPU seconds, and the client's own event-loop lag and CPU (a client
that stalls would be blamed on the target: direct's figures and the lag show it did not).
"""

from __future__ import annotations

import json
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
MODES = {"full": (200, 5), "quick": (200, 2), "smoke": (16, 1)}  # streams, answers per stream
CLIENTS = 2  # client processes: 100 streams each at 200, well within one process's reach
SURFACES = [  # (surface, scenario, targets serving it)
    ("/v1", drive.SCENARIOS[1], ("direct", "ceiling", "ours")),
    ("/llm", drive.SCENARIOS[2], ("ours",)),
]


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
    """One bounded run: CLIENTS processes, `streams` in all, all sending at the same moment."""
    clients = min(CLIENTS, streams)
    start_at = time.time() + 1.0  # time for every client to open its connections first
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
    return {
        "streams": streams * rounds, "completed": sum(r["completed"] for r in results),
        "errors": sum(r["errors"] for r in results) + len(failures) * rounds, "client_failures": failures,
        "ttft_p50_ms": percentile(merged["ttft_ms"], 50), "ttft_p99_ms": percentile(merged["ttft_ms"], 99),
        "gap_p50_ms": percentile(merged["gaps_ms"], 50), "gap_p99_ms": percentile(merged["gaps_ms"], 99),
        "gap_max_ms": max(merged["gaps_ms"], default=None), "gaps": len(merged["gaps_ms"]),
        "cpu_s": cpu_s, "wall_s": client_wall,
        "client_lag_p99_ms": percentile(merged["lag_ms"], 99), "client_lag_max_ms": max(merged["lag_ms"], default=None),
        "client_cpu_pct": max((100 * r["cpu_s"] / r["wall_s"] for r in results if r["wall_s"]), default=None),
    }


def measure(mode: str, procs: t.Procs, load: set[int] | None, tcpus: set[int] | None, wanted: list[str],
            quiet_budget: float) -> tuple[dict[str, dict[str, Any]], float]:
    """Every paced cell, keyed `surface|target`; returns them and the quiet budget left."""
    streams, rounds = MODES[mode]
    up, missing = start(procs, load, tcpus, wanted)
    cells: dict[str, dict[str, Any]] = {f"/v1|{n}": {"unavailable": why} for n, why in missing.items()}
    if "ours" in missing:
        cells["/llm|ours"] = {"unavailable": missing["ours"]}
    stub_pids = up["direct"].pids()
    for surface, scenario, serving in SURFACES:
        for name in (n for n in serving if n in up):
            target = up[name]
            url = target.url + (drive.path_for(scenario, target.messages_path) or "")
            ok, detail = drive.check(url, scenario, target.headers)
            if not ok:
                cells[f"{surface}|{name}"] = {"unavailable": f"did not answer: {detail}"}
                continue
            pids = sorted(set(target.pids() + stub_pids))
            if mode != "smoke":  # warm-up: every upstream connection open, then idle again
                drive_streams(url, scenario.body(), streams, 1, load, target.pids())
                t.settle(pids)
            if quiet_budget > 0:
                quiet_budget -= t.wait_quiet(pids, 25, min(10, quiet_budget))
            background = t.Background(pids)
            cell = drive_streams(url, scenario.body(), streams, rounds, load, target.pids())
            cell["background_cpu_pct"] = background.percent()
            cells[f"{surface}|{name}"] = cell
            print(f"  paced {surface:<4} {name:<8} {cell['completed']}/{cell['streams']} streams, gap p99 "
                  f"{cell['gap_p99_ms'] or 0:.1f} ms, CPU {cell['cpu_s']:.2f} s, client lag p99 "
                  f"{cell['client_lag_p99_ms'] or 0:.1f} ms, background CPU {cell['background_cpu_pct']:.0f}%",
                  flush=True)
            t.settle(pids)
    return cells, quiet_budget
