"""Side-by-side benchmark: stub direct, nginx, the ceiling, our gateway (keys off and on) and,
on request, LiteLLM proxy.

    bench/run            # full run (~25 min): installs nginx, wrk and valgrind, then this script
    bench/run --quick    # ~12 min, 2 s per cell
    .venv/bin/python bench/harness.py --smoke   # CI: a few seconds, installs nothing

For every scenario (/v1 non-stream, /v1 stream, /llm stream) and concurrency (1, 16, 64) the
targets are driven in rotation (direct, nginx, ceiling, ours, keyed; the start rotates each
round): warm-up, measured run with wrk, then for streams the TTFT probe (loadgen.py). Then
the paced capacity search (paced.py): 100, 200, ... concurrent streams at 50 tokens/s
against direct, the ceiling and the gateway, until each fails a step. Then the instructions
per c64 request of the ceiling, ours and keyed under callgrind (instructions.py). Prints the
tables and the targets as met / missed by how much; writes JSON to bench/out/. See
bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import drive
import instructions
import paced
import peers
import report
import targets as t

MODES = {  # duration, warm-up, ttft window (seconds), rounds, concurrency, requests per callgrind run
    "full": (5.0, 1.0, 2.0, 3, [1, 16, 64], 1600),
    "quick": (2.0, 1.0, 1.0, 1, [1, 16, 64], 400),
    "smoke": (0.3, 0.0, 0.0, 1, [4], 0),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick")
    mode.add_argument("--smoke", action="store_const", dest="mode", const="smoke",
                      help="CI form: loadgen driver, direct + ours (+ nginx/LiteLLM if installed)")
    p.add_argument("--targets", default="direct,nginx,ceiling,ours,keyed",
                   help="comma list (ceiling: bench/ceiling.py, one Litestar handler relaying via aiohttp; "
                   "litellm: LiteLLM proxy, bench/run installs it when named here)")
    p.add_argument("--concurrency", help="comma list, default 1,16,64")
    p.add_argument("--scenarios", default="v1,v1-stream,llm-stream,paced",
                   help="comma list; paced: the capacity search at 50 tokens/s (bench/paced.py)")
    p.add_argument("--duration", type=float, help="seconds per measured run")
    p.add_argument("--rounds", type=int)
    p.add_argument("--pin", choices=["split", "none"], default="split",
                   help="split: load generator + stub on the first CPU, the target on the second")
    p.add_argument("--driver", choices=["auto", "wrk", "loadgen"], default="auto")
    p.add_argument("--tokens", type=int, default=20, help="stub answer length (stream chunks)")
    p.add_argument("--quiet-budget", type=float, help="seconds the run may spend in total waiting, before "
                   "measured runs, for other processes to leave the CPUs (default 60, smoke 0)")
    p.add_argument("--instructions", type=int, help="requests per callgrind run that counts the c64 "
                   "instructions per request of the ceiling, ours and keyed (the per-request verdicts); 0: none "
                   "(default full 1600, quick 400, smoke 0)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    args = p.parse_args(argv)
    args.mode = args.mode or "full"
    duration, warmup, ttft, rounds, conc, counted = MODES[args.mode]
    args.duration = min(args.duration or duration, 60.0)
    args.warmup, args.ttft = warmup, ttft
    args.quiet_budget = args.quiet_budget if args.quiet_budget is not None else (0 if args.mode == "smoke" else 60)
    args.rounds = min(args.rounds or rounds, 5)
    args.instructions = min(max(args.instructions if args.instructions is not None else counted, 0), 20_000)
    args.concurrency = [int(c) for c in args.concurrency.split(",")] if args.concurrency else conc
    if args.driver == "auto":
        args.driver = "wrk" if drive.wrk_binary() and args.mode != "smoke" else "loadgen"
    return args


def cpu_layout(pin: str) -> tuple[set[int] | None, set[int] | None]:
    """(load generator + stub CPUs, target CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if pin == "none" or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def start_targets(args: argparse.Namespace, procs: t.Procs, load: set[int] | None, tcpus: set[int] | None,
                  ) -> tuple[dict[str, t.Target], dict[str, str]]:
    stub = t.start_stub(procs, load, args.tokens)
    started: dict[str, t.Target] = {}
    missing: dict[str, str] = {}
    wanted = args.targets.split(",")
    starters = {"nginx": peers.start_nginx, "ceiling": peers.start_ceiling, "ours": t.start_gateway,
                "keyed": t.start_keyed_gateway, "litellm": peers.start_litellm}
    for name in report.TARGET_ORDER:
        if name not in wanted:
            continue
        if name == "direct":
            started[name] = stub
            continue
        if args.mode == "smoke" and name == "nginx" and t.nginx_binary() is None:
            missing[name] = "not installed (smoke installs nothing)"
            continue
        if name == "litellm" and t.litellm_binary() is None and os.environ.get("BENCH_LITELLM_NOTE"):
            missing[name] = os.environ["BENCH_LITELLM_NOTE"]
            continue
        try:
            started[name] = starters[name](procs, tcpus, stub.url)
        except RuntimeError as exc:
            missing[name] = f"could not start: {exc}".replace("\n", " ")[:300]
        print(f"  {name}: {'up at ' + started[name].url if name in started else missing[name]}", flush=True)
    return started, missing


def measure(args: argparse.Namespace, up: dict[str, t.Target], load: set[int] | None, workdir: Path,
            cells: dict[str, list[dict[str, Any]]], answered: dict[str, str]) -> None:
    scenarios = [s for s in drive.SCENARIOS if s.key in args.scenarios.split(",")]
    names = list(up)
    stub_pids = up["direct"].pids() if "direct" in up else []
    for rnd in range(args.rounds):
        for scenario in scenarios:
            for c in args.concurrency:
                shift = (rnd + c) % len(names)
                for name in names[shift:] + names[:shift]:
                    target = up[name]
                    path = drive.path_for(scenario, target.messages_path)
                    if path is None or answered.get(f"{scenario.key}|{name}") != "ok":
                        continue
                    url = target.url + path
                    if args.warmup:
                        drive.run_load(url, scenario, target.headers, c, args.warmup, workdir, load, args.driver)
                        t.settle(target.pids() + stub_pids)  # requests the warm-up left behind
                    if args.quiet_budget > 0:
                        args.quiet_budget -= t.wait_quiet(target.pids() + stub_pids, 25, min(10, args.quiet_budget))
                    background = t.Background(target.pids() + stub_pids)
                    result = drive.run_load(url, scenario, target.headers, c, args.duration, workdir, load,
                                            args.driver)
                    result["background_cpu_pct"] = background.percent()
                    if scenario.stream and args.driver == "wrk" and args.ttft:
                        probe = drive.probe_ttft(url, scenario, target.headers, c, args.ttft, workdir, load,
                                                 args.driver)
                        result["ttft_p50_ms"], result["ttft_driver"] = probe.get("ttft_p50_ms"), "loadgen probe"
                    elif scenario.stream:
                        result["ttft_driver"] = "loadgen"
                    cells.setdefault(f"{scenario.key}|{c}|{name}", []).append(result)
                    print(f"  round {rnd + 1} {scenario.label:<15} c={c:<3} {name:<11} "
                          f"{result.get('rps', 0):>9.0f} req/s  errors {result.get('errors')}  "
                          f"background CPU {result['background_cpu_pct']:.0f}%", flush=True)
                    t.settle(target.pids() + stub_pids)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load, tcpus = cpu_layout(args.pin)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (`cmd &`)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    began = time.monotonic()
    print(f"bench: mode {args.mode}, driver {args.driver}, pin {args.pin} (load+stub CPUs {load}, "
          f"target CPUs {tcpus}), {args.duration:g} s x {args.rounds} round(s)", flush=True)
    raw: dict[str, list[dict[str, Any]]] = {}
    answered: dict[str, str] = {}
    rss: dict[str, float | None] = {}
    missing: dict[str, str] = {}
    paced_cells: dict[str, dict[str, Any]] | None = None
    capacity: dict[str, Any] | None = None
    counts: dict[str, Any] | None = None
    up_names: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        procs = t.Procs(Path(tmp))
        try:
            up, missing = start_targets(args, procs, load, tcpus)
            up_names = list(up)
            for scenario in drive.SCENARIOS:
                for name, target in up.items():
                    path = drive.path_for(scenario, target.messages_path)
                    if path is not None:
                        ok, detail = drive.check(target.url + path, scenario, target.headers)
                        answered[f"{scenario.key}|{name}"] = detail
                        if not ok:
                            print(f"  {name} {scenario.label}: {detail}", flush=True)
            measure(args, up, load, Path(tmp), raw, answered)
            rss = {name: t.peak_rss_mb(target.pids()) for name, target in up.items()}
            if "paced" in args.scenarios.split(","):
                print("  paced capacity search: its own stub (--chunk-delay), ceiling and gateway", flush=True)
                capacity, args.quiet_budget = paced.measure(args.mode, procs, load, tcpus,
                                                            args.targets.split(","), args.quiet_budget)
                paced_cells = paced.summary_cells(capacity)
        finally:
            procs.stop_all()
    if args.instructions:
        print("  instructions per request under callgrind: each target and scenario afresh, one at a time", flush=True)
        counts = instructions.measure(args.targets.split(","), args.scenarios.split(","), args.instructions, args.pin)
    cells = {key: report.aggregate(runs) for key, runs in raw.items()}
    for key, detail in answered.items():
        if detail != "ok":
            scenario_key, name = key.split("|")
            for c in args.concurrency:
                cells[f"{scenario_key}|{c}|{name}"] = {"unavailable": f"did not answer: {detail}"}
    for name, why in missing.items():
        for scenario in drive.SCENARIOS:
            if not (scenario.anthropic and name in report.NO_MESSAGES):
                for c in args.concurrency:
                    cells[f"{scenario.key}|{c}|{name}"] = {"unavailable": why}
    labels = [(s.key, s.label) for s in drive.SCENARIOS if s.key in args.scenarios.split(",")]
    print()
    print(report.table(cells, labels, args.concurrency))
    print("\npeak RSS (VmHWM, process tree): " + " | ".join(
        f"{n} {v:.1f} MB" if v is not None else f"{n} n/a" for n, v in rss.items()))
    print(f"gateway interpreter: {t.gateway_python()}" + (f"; ceiling: {peers.ceiling_python()}"
                                                           if "ceiling" in up_names else ""))
    if capacity is not None:
        print()
        print(report.capacity_table(capacity))
    if counts is not None:
        print()
        print(instructions.table(counts))
    print()
    same = "ceiling" in up_names and peers.ceiling_python() == t.gateway_python()
    results = report.checks(cells, rss, same, capacity, counts) if args.mode != "smoke" else []
    for line in results:
        print(line["text"])
    if results:
        print(report.summary(results))
    record = {"mode": args.mode, "driver": args.driver, "pin": args.pin, "duration_s": args.duration,
              "rounds": args.rounds, "concurrency": args.concurrency, "machine": report.machine(),
              "command": " ".join(["bench/harness.py", *(argv if argv is not None else sys.argv[1:])]),
              "elapsed_s": round(time.monotonic() - began, 1), "cells": cells, "peak_rss_mb": rss,
              "gateway_python": t.gateway_python(), "paced": paced_cells, "paced_capacity": capacity,
              "instructions": counts,
              "paced_setup": {"steps_rounds": paced.MODES[args.mode], "tokens": paced.TOKENS,
                              "chunk_delay_s": paced.CHUNK_DELAY, "streams_per_client": paced.STREAMS_PER_CLIENT},
              "answered": answered, "unavailable": missing, "checks": results}
    path = report.write_json(Path(args.out), record)
    print(f"\nJSON: {path}  ({record['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; every started process was stopped", file=sys.stderr)
        sys.exit(130)
