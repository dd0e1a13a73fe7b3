"""What one request costs the target process: CPU time (or instructions) per 1,000 requests.

    .venv/bin/python bench/cpu_cost.py --target ours --scenario v1-stream
    .venv/bin/python bench/cpu_cost.py --target ceiling --scenario paced-v1 --streams 200
    .venv/bin/python bench/cpu_cost.py --target ours --scenario v1 --callgrind --requests 1600

The A/B tool for a busy machine. Wall-clock throughput moves with whatever else runs; the CPU
time the target itself spends on a fixed amount of work moves much less, and the instructions
it runs not at all. This starts a stub (pinned with the load generator to the first CPU) and
the target (alone on the second), warms up, then `--repeat` times sends exactly `--requests`
requests at `--concurrency` (bench/loadgen.py, closed loop: the target always has
`--concurrency` in flight, as in the c64 rows of bench/run) and reads the target's utime +
stime from /proc/<pid>/stat before and after (after the target is idle again, so trailing work
counts). Prints CPU ms per request, CPU s per 1,000 requests and per 1,000 streamed tokens, for
each repeat and their median.

`paced-v1` / `paced-llm`: the stub paces (`--chunk-delay 0.02 --tokens 50`) and
bench/paced_client.py holds `--streams` concurrent streams of `--rounds` answers each.

`--callgrind`: the target runs under `valgrind --tool=callgrind` (bench/callgrind.py) with
instrumentation off until the warm-up is done; then the counters are zeroed, the requests
sent, and the counters dumped: instructions per request, exact and repeatable under any load
(user space only: the kernel's share of a send or a read is not in it; the CPU time is). Slow
(25-50x): a few hundred to a few thousand requests. bench/run's per-request verdicts are these
counts. The dump (bench/out/callgrind-<target>-<scenario>.out) opens with `callgrind_annotate`
for the C-level split (interpreter, msgspec, uvloop, ...).

`--cache-sim`: `--callgrind` with valgrind's cache simulation, its two levels sized as this
CPU's L1 and L2 (read from /sys: the second level stands for L2, not the last level): misses
per request of the first level (I1, D1 read and write) and of L2 (IL, DL read and write). The
instructions a target runs and the cycles it takes part where its code and objects do not fit
near the core: two targets compared by both tell whether the wall clock's ratio is
instructions or memory. The same dump opens with
`callgrind_annotate --show=DLmr,DLmw --sort=DLmw` for where.

`--syscalls`: `strace -c` attached for the measured run: system calls per request.

Loopback only; every run bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import callgrind as cg
import drive
import paced
import peers
import targets as t

OUT = Path(__file__).resolve().parent / "out"
SCENARIOS = {  # name: (drive.Scenario, paced?)
    "v1": (drive.SCENARIOS[0], False),
    "v1-stream": (drive.SCENARIOS[1], False),
    "llm-stream": (drive.SCENARIOS[2], False),
    "paced-v1": (drive.SCENARIOS[1], True),
    "paced-llm": (drive.SCENARIOS[2], True),
}
LOAD_TOKENS = 20  # the stub's answer length in bench/run's load rows


def user_system(pids: list[int]) -> tuple[int, int]:
    """(utime, stime) in clock ticks, summed over the processes."""
    user = system = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user, system


def start(name: str, procs: t.Procs, tcpus: set[int] | None, stub_url: str, wrap: tuple[str, ...]) -> t.Target:
    if name == "ceiling":
        return peers.start_ceiling(procs, tcpus, stub_url, wrap=wrap)
    if name == "keyed":
        return t.start_keyed_gateway(procs, tcpus, stub_url, wrap=wrap)
    return t.start_gateway(procs, tcpus, stub_url, wrap=wrap)


def send(url: str, scenario: drive.Scenario, target: t.Target, count: int, concurrency: int,
         load: set[int] | None) -> dict[str, Any]:
    """Exactly `count` requests (bench/loadgen.py), bounded in time."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "loadgen.py"), "--url", url,
            "--body", scenario.body().decode(), "--concurrency", str(concurrency), "--requests", str(count),
            "--duration", "600"]
    for key, value in target.headers.items():
        argv += ["--header", f"{key}: {value}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=drive._pinned(load))
    return drive.collect(proc, 600)


class Syscalls:
    """`strace -c -f` attached to the target for the measured run: system calls per request
    (exact counts, whatever the load; strace slows the target, so its CPU time is not kept)."""

    def __init__(self, workdir: Path) -> None:
        self.out = workdir / "strace.txt"
        self.proc: subprocess.Popen[bytes] | None = None

    def begin(self, pid: int) -> None:
        self.proc = subprocess.Popen(["strace", "-c", "-f", "-q", "-o", str(self.out), "-p", str(pid)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread before the load starts

    def end(self) -> dict[str, int]:
        assert self.proc is not None
        self.proc.send_signal(2)  # SIGINT: strace detaches and writes its table
        self.proc.wait(timeout=60)
        counts: dict[str, int] = {}
        for line in self.out.read_text().splitlines():
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors,] syscall
            if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
                counts[parts[-1]] = int(parts[3])
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def measure(args: argparse.Namespace, on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One target and scenario as `args` says (`parse`); `on_run` sees each measured run as it ends."""
    scenario, is_paced = SCENARIOS[args.scenario]
    cpus = sorted(os.sched_getaffinity(0))
    load, tcpus = ({cpus[0]}, {cpus[1]}) if len(cpus) > 1 and args.pin == "split" else (None, None)
    tokens = args.tokens or (paced.TOKENS if is_paced else LOAD_TOKENS)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        procs = t.Procs(Path(tmp))
        grind = cg.Callgrind(Path(tmp), args.cache_sim) if args.callgrind else None
        trace = Syscalls(Path(tmp)) if args.syscalls else None
        try:
            stub = t.start_stub(procs, load, tokens, paced.CHUNK_DELAY if is_paced else 0.0)
            target = start(args.target, procs, tcpus, stub.url, grind.wrap() if grind else ())
            assert target.proc is not None
            path = drive.path_for(scenario, target.messages_path)
            url = target.url + (path or "")
            ok, detail = drive.check(url, scenario, target.headers)
            if not ok:
                raise SystemExit(f"cpu_cost: {args.target} does not answer {args.scenario}: {detail}")
            pids = target.pids()
            rss_idle = t.peak_rss_mb(pids)
            work = args.streams * args.rounds if is_paced else args.requests

            def run_once() -> dict[str, Any]:
                if is_paced:
                    return paced.drive_streams(url, scenario.body(), args.streams, args.rounds, load, pids)
                return send(url, scenario, target, args.requests, args.concurrency, load)

            # Warm-up: connections open, caches and the allocator's arenas filled.
            if is_paced:
                paced.drive_streams(url, scenario.body(), args.streams, 1, load, pids)
            else:
                send(url, scenario, target, args.warmup if not grind else min(args.warmup, 200),
                     args.concurrency, load)
            t.settle(pids, 30 if grind else 5)
            for _ in range(1 if grind or trace else args.repeat):
                if grind:
                    grind.begin(target.proc.pid)
                if trace:
                    trace.begin(target.proc.pid)
                background = t.Background(pids + stub.pids())
                before = t.cpu_ticks(pids)
                user0, system0 = user_system(pids)
                result = run_once()
                t.settle(pids, 60 if grind else 5)  # trailing work (closing streams) counts
                cpu_s = (t.cpu_ticks(pids) - before) / t.CLK_TCK
                user1, system1 = user_system(pids)
                done = int(result.get("completed", result.get("ok", 0)) or 0)
                run: dict[str, Any] = {
                    "requests": work, "completed": done, "errors": result.get("errors"),
                    "cpu_s": cpu_s, "user_s": (user1 - user0) / t.CLK_TCK, "system_s": (system1 - system0) / t.CLK_TCK,
                    "background_cpu_pct": round(background.percent(), 1),
                    "cpu_ms_per_request": 1000 * cpu_s / done if done else None,
                    "cpu_s_per_1k_tokens": 1000 * cpu_s / (done * tokens) if done else None,
                }
                if trace:
                    run["syscalls_per_request"] = {k: round(v / max(done, 1), 2) for k, v in trace.end().items()}
                if grind:
                    events, dump = grind.end(target.proc.pid)
                    instructions = events["Ir"]
                    kept = OUT / f"callgrind-{args.target}-{args.scenario}.out"
                    OUT.mkdir(exist_ok=True)
                    shutil.copyfile(dump, kept)
                    by_object, by_function = cg.split(kept)
                    per = max(done, 1)
                    run.update(instructions=instructions, instructions_per_request=instructions // per,
                               dump=str(kept),
                               per_object={Path(k).name: v // per for k, v in
                                           sorted(by_object.items(), key=lambda kv: -kv[1])[:15]},
                               per_function={k: v // per for k, v in
                                             sorted(by_function.items(), key=lambda kv: -kv[1])[:25]})
                    if args.cache_sim:
                        run["misses_per_request"] = cg.misses(events, per)
                runs.append(run)
                if on_run:
                    on_run(run)
            rss_peak = t.peak_rss_mb(pids)
        finally:
            procs.stop_all()
    per_req = [r["cpu_ms_per_request"] for r in runs if r["cpu_ms_per_request"] is not None]
    summary: dict[str, Any] = {
        "target": args.target, "scenario": args.scenario, "concurrency": None if is_paced else args.concurrency,
        "streams": args.streams if is_paced else None, "tokens_per_request": tokens,
        "interpreter": peers.ceiling_python() if args.target == "ceiling" else t.gateway_python(),
        "runs": runs, "peak_rss_mb_at_start": round(rss_idle, 1), "peak_rss_mb": round(rss_peak, 1),
        "cpu_ms_per_request_median": statistics.median(per_req) if per_req else None,
        "cpu_ms_per_request_min": min(per_req) if per_req else None,
    }
    if summary["cpu_ms_per_request_median"] is not None:
        summary["cpu_s_per_1k_requests_median"] = summary["cpu_ms_per_request_median"]
        summary["cpu_s_per_1k_tokens_median"] = summary["cpu_ms_per_request_median"] / tokens
    if grind and runs:
        summary["instructions_per_request"] = runs[0].get("instructions_per_request")
    return summary


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", choices=["ours", "keyed", "ceiling"], default="ours")
    p.add_argument("--scenario", choices=list(SCENARIOS), default="v1")
    p.add_argument("--requests", type=int, default=5000, help="requests per measured run (load scenarios)")
    p.add_argument("--warmup", type=int, default=1000, help="requests before measuring")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--tokens", type=int, default=0,
                   help="the stub's answer length (default: 20, paced 50); two lengths split per-request "
                        "from per-token cost")
    p.add_argument("--streams", type=int, default=200, help="paced: concurrent streams")
    p.add_argument("--rounds", type=int, default=3, help="paced: answers per stream per measured run")
    p.add_argument("--repeat", type=int, default=3, help="measured runs (callgrind: one)")
    p.add_argument("--pin", choices=["split", "none"], default="split")
    p.add_argument("--callgrind", action="store_true", help="instruction counts under valgrind (slow)")
    p.add_argument("--cache-sim", action="store_true",
                   help="--callgrind with its cache simulation sized as this CPU's L1 and L2: misses per request")
    p.add_argument("--syscalls", action="store_true", help="system calls per request (strace -c; slows the target)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = p.parse_args(argv)
    args.requests = max(1, min(args.requests, 100_000))
    args.streams = max(1, min(args.streams, 1000))
    args.rounds = max(1, min(args.rounds, 20))
    args.repeat = max(1, min(args.repeat, 10))
    args.callgrind = args.callgrind or args.cache_sim
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.callgrind and shutil.which("valgrind") is None:
        print("cpu_cost: --callgrind needs valgrind (apt-get install valgrind)")
        return 2
    summary = measure(args, lambda run: print(json.dumps(run), file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    unit = "stream" if summary["streams"] else "request"
    load = (f"{summary['streams']} paced streams x {args.rounds}" if summary["streams"]
            else f"{args.requests} requests at c{args.concurrency}")
    print(f"{args.target} {args.scenario} ({load}, {summary['tokens_per_request']} tokens each):")
    for r in summary["runs"]:
        line = (f"  {r['completed']}/{r['requests']} done, CPU {r['cpu_s']:.2f} s (system {r['system_s']:.2f}) = "
                f"{r['cpu_ms_per_request'] or 0:.3f} ms/{unit}, {r['cpu_s_per_1k_tokens'] or 0:.4f} s/1k tokens, "
                f"bg {r['background_cpu_pct']:.0f}%")
        if "instructions_per_request" in r:
            line += f", {r['instructions_per_request']:,} instructions/{unit} ({r['dump']})"
        print(line)
        if "misses_per_request" in r:
            m = r["misses_per_request"]
            print(f"  cache misses per {unit} (simulated): L1 {m['L1']:,.0f} (I1 {m['I1mr']:,.0f}, D1 read "
                  f"{m['D1mr']:,.0f}, write {m['D1mw']:,.0f}), L2 {m['L2']:,.0f} (instructions {m['ILmr']:,.0f}, "
                  f"data read {m['DLmr']:,.0f}, write {m['DLmw']:,.0f})")
        if "syscalls_per_request" in r:
            calls = r["syscalls_per_request"].items()
            print(f"  system calls per {unit}: " + ", ".join(f"{k} {v:g}" for k, v in calls))
        for title, key in (("self instructions per " + unit + " by shared object:", "per_object"),
                           ("by C function:", "per_function")):
            if key in r:
                print("  " + title)
                for what, n in r[key].items():
                    print(f"    {n:>10,}  {100 * n / max(r['instructions_per_request'], 1):5.1f}%  {what}")
    print(f"  peak RSS (VmHWM): {summary['peak_rss_mb_at_start']:.1f} MB when ready, {summary['peak_rss_mb']:.1f} MB "
          "after the load")
    if summary["cpu_ms_per_request_median"] is not None:
        print(f"  median: {summary['cpu_ms_per_request_median']:.3f} ms/{unit} "
              f"(= CPU s per 1,000 {unit}s), {summary['cpu_s_per_1k_tokens_median']:.4f} CPU s per 1,000 tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
