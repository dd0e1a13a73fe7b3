"""What one request costs the target process: CPU time (or instructions) per 1,000 requests.

    .venv/bin/python bench/cpu_cost.py --target ours --scenario v1-stream
    .venv/bin/python bench/cpu_cost.py --target ceiling --scenario paced-v1 --streams 200
    .venv/bin/python bench/cpu_cost.py --target ours --scenario v1 --callgrind --requests 400

The A/B tool for a busy machine (issue 21). Wall-clock throughput moves with whatever else
runs; the CPU time the target itself spends on a fixed amount of work moves much less. This
starts a stub (pinned with the load generator to the first CPU) and the target (alone on the
second), warms up, then `--repeat` times sends exactly `--requests` requests at
`--concurrency` (bench/loadgen.py, closed loop: the target always has `--concurrency` in
flight, as in the c64 rows of bench/run) and reads the target's utime + stime from
/proc/<pid>/stat before and after (after the target is idle again, so trailing work counts).
Prints CPU ms per request, CPU s per 1,000 requests and per 1,000 streamed tokens, for each
repeat and their median.

`paced-v1` / `paced-llm`: the stub paces (`--chunk-delay 0.02 --tokens 50`) and
bench/paced_client.py holds `--streams` concurrent streams of `--rounds` answers each.

`--callgrind`: the target runs under `valgrind --tool=callgrind` with instrumentation off
until the warm-up is done; then the counters are zeroed, the requests sent, and the
counters dumped: instructions per request, exact and repeatable under any load (user space
only: the kernel's share of a send or a read is not in it; the CPU time is). Slow (about
50x): use a few hundred requests. The dump (bench/out/callgrind-<target>-<scenario>.out)
opens with `callgrind_annotate` for the C-level split (interpreter, msgspec, uvloop, ...).

`--cache-sim`: `--callgrind` with valgrind's cache simulation, its two levels sized as this
CPU's L1 and L2 (read from /sys: the second level stands for L2, not the last level): misses
per request of the first level (I1, D1 read and write) and of L2 (IL, DL read and write). The
instructions a target runs and the cycles it takes part where its code and objects do not fit
near the core: ours and the ceiling compared by both tell whether the wall clock's ratio is
instructions or memory (RESULTS.md, issue 21, twelfth pass). The same dump opens with
`callgrind_annotate --show=DLmr,DLmw --sort=DLmw` for where.

`--cprofile`: the target runs on bench/whatif.py with its `cprofile` patch, switched on for the
measured run only (SIGUSR1 before and after): Python function calls per request and the
functions with the most calls per request, kept in bench/out/cprofile-<target>-<scenario>.pstats.
Counts, not times, are what to compare (the profiler slows every call alike).

`--opcodes`: the same with whatif's `opcodes` patch: the Python opcodes the target ran per
request, by package (`src`, `litestar`, `aiohttp`, ...) and by function, kept in
bench/out/opcodes-<target>-<scenario>.json. Exact and machine-independent like callgrind, but
per Python function: where ours' own bytecode goes, and that the stack runs the same for ours
and the ceiling. Very slow (a trace call per opcode): a few hundred requests.

Loopback only; every run bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import drive
import paced
import peers
import targets as t

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parents[1]  # the project
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


def cache_levels(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> list[str]:
    """valgrind's `--I1`, `--D1` and `--LL` options for this CPU's L1 and L2 (`size,ways,line`);
    a level valgrind cannot model (its sets not a power of two) or that /sys does not tell is
    left to valgrind's own guess."""
    flags: dict[str, str] = {}
    for index in sorted(sysfs.glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        octets = int(size[:-1]) * {"K": 1024, "M": 1024 * 1024}[size[-1]] if size[-1] in "KM" else int(size)
        sets = octets // max(ways * line, 1)
        if ways <= 0 or sets <= 0 or sets & (sets - 1):
            continue
        name = {("1", "Data"): "D1", ("1", "Instruction"): "I1", ("2", "Unified"): "LL"}.get((level, kind))
        if name:
            flags[name] = f"--{name}={octets},{ways},{line}"
    return [flags[name] for name in ("I1", "D1", "LL") if name in flags]


def events_of(dump: Path) -> dict[str, int]:
    """A callgrind dump's totals by event (`events:` names the `summary:` or `totals:` numbers);
    empty while the dump is not complete."""
    names: list[str] = []
    with dump.open(errors="replace") as lines:
        for line in lines:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                return dict(zip(names, map(int, line.split()[1:]), strict=False))
    return {}


class Callgrind:
    """callgrind_control on the target: instrumentation on, counters zeroed, dumped."""

    def __init__(self, workdir: Path, cache_sim: bool = False) -> None:
        self.workdir = workdir
        self.control = shutil.which("callgrind_control") or "callgrind_control"
        self.cache = ("--cache-sim=yes", *cache_levels()) if cache_sim else ()

    def wrap(self) -> tuple[str, ...]:
        # --trace-children: an interpreter that is a script re-executing itself (bench/whatif.py)
        return ("valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no", "--trace-children=yes",
                *self.cache, f"--callgrind-out-file={self.workdir}/callgrind.out.%p")

    def _run(self, *args: str) -> None:
        subprocess.run([self.control, *args], check=True, capture_output=True, timeout=120)

    def begin(self, pid: int) -> None:
        self._run("-i", "on", str(pid))
        self._run("-z", str(pid))

    def end(self, pid: int) -> tuple[dict[str, int], Path]:
        """The dump's totals by event (`Ir`: instructions) and the dump."""
        before = set(self.workdir.glob(f"callgrind.out.{pid}*"))
        self._run("-d", str(pid))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for path in set(self.workdir.glob(f"callgrind.out.{pid}*")) - before:
                events = events_of(path)
                if events:
                    return events, path
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")


class Profiler:
    """A bench/whatif.py patch in the target that SIGUSR1 switches (`cprofile`, `opcodes`): one
    signal starts it, the next writes its file."""

    FILES = {"cprofile": ("cprofile.pstats", "WHATIF_PROFILE_FILE"), "opcodes": ("opcodes.json", "WHATIF_OPCODES_FILE")}

    def __init__(self, workdir: Path, patch: str = "cprofile") -> None:
        name, variable = self.FILES[patch]
        self.out = workdir / name
        os.environ["BENCH_GATEWAY_PYTHON"] = str(Path(__file__).resolve().parent / "whatif.py")
        os.environ["WHATIF"] = ",".join(w for w in [os.environ.get("WHATIF", ""), patch] if w)
        os.environ[variable] = str(self.out)

    def begin(self, pid: int) -> None:
        os.kill(pid, signal.SIGUSR1)

    def end(self, pid: int) -> Path:
        self.out.unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        size = -1
        while time.monotonic() < deadline:  # written when its size stops changing
            now = self.out.stat().st_size if self.out.exists() else -1
            if now > 0 and now == size:
                return self.out
            size = now
            time.sleep(0.5)
        raise RuntimeError("the target wrote no profile")


def profile_split(path: Path, per: int, top: int = 40) -> tuple[int, dict[str, float]]:
    """Function calls per request, and the `top` functions by calls per request."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    calls: dict[str, float] = {}
    total = 0
    for (filename, line, name), (_, ncalls, *_rest) in stats.items():
        total += ncalls
        where = "/".join(filename.split("/")[-2:]) if filename != "~" else ""
        calls[f"{name} ({where}:{line})" if where else name] = ncalls / per
    ranked = dict(sorted(calls.items(), key=lambda kv: -kv[1])[:top])
    return total // per, ranked


def package_of(filename: str) -> str:
    """Whose code a code object's file is: `src`, `bench`, a site-packages distribution's top
    module, `stdlib`, or the name as it is (frozen modules, `<string>`)."""
    if "/site-packages/" in filename:
        return filename.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if filename.startswith(str(ROOT / "src")):
        return "src"
    if filename.startswith(str(ROOT / "bench")):
        return "bench"
    if "/lib/python3" in filename:
        return "stdlib"
    return filename


def opcode_split(path: Path, per: int, top: int = 40) -> tuple[int, dict[str, float], dict[str, float]]:
    """Opcodes per request, per package, and the `top` functions (`file:line name`) by opcodes
    per request, from whatif's `opcodes` counts."""
    counts: dict[str, int] = json.loads(path.read_text())
    by_package: dict[str, float] = {}
    by_function: dict[str, float] = {}
    for key, n in counts.items():
        filename, line, name = key.rsplit(":", 2)
        package = package_of(filename)
        by_package[package] = by_package.get(package, 0) + n / per
        short = filename.split("/site-packages/")[-1].removeprefix(str(ROOT) + "/")
        by_function[f"{name} ({short}:{line})"] = n / per
    ranked = dict(sorted(by_function.items(), key=lambda kv: -kv[1])[:top])
    packages = dict(sorted(by_package.items(), key=lambda kv: -kv[1]))
    return sum(counts.values()) // per, packages, ranked


def split(dump: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Self instructions per shared object and per C function of a callgrind dump (the
    inclusive cost line after each `calls=` is skipped)."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fl": {}, "fn": {}}  # one id space each
    by_object: dict[str, int] = {}
    by_function: dict[str, int] = {}

    def name(space: str, spec: str) -> str:  # "(id) name" defines an id, "(id)" refers to it
        spec = spec.strip()
        if spec.startswith("("):
            ident, _, rest = spec.partition(")")
            if rest.strip():
                names[space][ident] = rest.strip()
            return names[space].get(ident, spec)
        return spec

    spaces = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl",
              "cfl": "fl"}
    obj = fn = "?"
    skip = False
    with dump.open(errors="replace") as lines:
        for line in lines:
            key, eq, rest = line.partition("=")
            if eq and key in spaces:
                value = name(spaces[key], rest)
                if key == "ob":
                    obj = value
                elif key == "fn":
                    fn = value
            elif key == "calls" and eq:
                skip = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:  # the inclusive cost of the call just named, not this function's own
                    skip = False
                    continue
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    cost = int(parts[1])
                    by_object[obj] = by_object.get(obj, 0) + cost
                    label = f"{fn} [{Path(obj).name}]"
                    by_function[label] = by_function.get(label, 0) + cost
    return by_object, by_function


def measure(args: argparse.Namespace) -> dict[str, Any]:
    scenario, is_paced = SCENARIOS[args.scenario]
    cpus = sorted(os.sched_getaffinity(0))
    load, tcpus = ({cpus[0]}, {cpus[1]}) if len(cpus) > 1 and args.pin == "split" else (None, None)
    tokens = args.tokens or (paced.TOKENS if is_paced else LOAD_TOKENS)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        procs = t.Procs(Path(tmp))
        grind = Callgrind(Path(tmp), args.cache_sim) if args.callgrind else None
        profiler = Profiler(Path(tmp)) if args.cprofile else None
        counter = Profiler(Path(tmp), "opcodes") if args.opcodes else None
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
            for _ in range(1 if grind or trace or profiler or counter else args.repeat):
                if profiler:
                    profiler.begin(target.proc.pid)
                if counter:
                    counter.begin(target.proc.pid)
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
                if profiler:
                    kept = OUT / f"cprofile-{args.target}-{args.scenario}.pstats"
                    OUT.mkdir(exist_ok=True)
                    shutil.copyfile(profiler.end(target.proc.pid), kept)
                    run["calls_per_request"], run["calls_by_function"] = profile_split(kept, max(done, 1))
                    run["profile"] = str(kept)
                if counter:
                    kept = OUT / f"opcodes-{args.target}-{args.scenario}.json"
                    OUT.mkdir(exist_ok=True)
                    shutil.copyfile(counter.end(target.proc.pid), kept)
                    run["opcodes_per_request"], run["opcodes_by_package"], run["opcodes_by_function"] = \
                        opcode_split(kept, max(done, 1))
                    run["opcodes"] = str(kept)
                if grind:
                    events, dump = grind.end(target.proc.pid)
                    instructions = events["Ir"]
                    kept = OUT / f"callgrind-{args.target}-{args.scenario}.out"
                    OUT.mkdir(exist_ok=True)
                    shutil.copyfile(dump, kept)
                    by_object, by_function = split(kept)
                    per = max(done, 1)
                    run.update(instructions=instructions, instructions_per_request=instructions // per,
                               dump=str(kept),
                               per_object={Path(k).name: v // per for k, v in
                                           sorted(by_object.items(), key=lambda kv: -kv[1])[:15]},
                               per_function={k: v // per for k, v in
                                             sorted(by_function.items(), key=lambda kv: -kv[1])[:25]})
                    if args.cache_sim:
                        run["misses_per_request"] = misses(events, per)
                runs.append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
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


def misses(events: dict[str, int], per: int) -> dict[str, float]:
    """Cache misses per request: the first level's (instructions, data read, data written), L2's
    (the simulation's last level) and their sums."""
    row = {name: round(events.get(name, 0) / per, 1) for name in ("I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")}
    row["L1"] = round(row["I1mr"] + row["D1mr"] + row["D1mw"], 1)
    row["L2"] = round(row["ILmr"] + row["DLmr"] + row["DLmw"], 1)
    return row


def main(argv: list[str] | None = None) -> int:
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
    p.add_argument("--opcodes", action="store_true",
                   help="Python opcodes per request by package and function (bench/whatif.py's `opcodes` "
                   "patch in the target; very slow: a few hundred requests)")
    p.add_argument("--cprofile", action="store_true",
                   help="Python function calls per request (cProfile in the target; slows it)")
    p.add_argument("--syscalls", action="store_true", help="system calls per request (strace -c; slows the target)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = p.parse_args(argv)
    args.requests = max(1, min(args.requests, 100_000))
    args.streams = max(1, min(args.streams, 1000))
    args.rounds = max(1, min(args.rounds, 20))
    args.repeat = max(1, min(args.repeat, 10))
    args.callgrind = args.callgrind or args.cache_sim
    if args.callgrind and shutil.which("valgrind") is None:
        print("cpu_cost: --callgrind needs valgrind (apt-get install valgrind)")
        return 2
    summary = measure(args)
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
        if "calls_per_request" in r:
            print(f"  Python function calls per {unit}: {r['calls_per_request']:,} ({r['profile']}); the most called:")
            for what, n in r["calls_by_function"].items():
                print(f"    {n:8.2f}  {what}")
        if "opcodes_per_request" in r:
            print(f"  Python opcodes per {unit}: {r['opcodes_per_request']:,} ({r['opcodes']}); by package: "
                  + ", ".join(f"{k} {v:,.0f}" for k, v in r["opcodes_by_package"].items() if v >= 1))
            for what, n in r["opcodes_by_function"].items():
                print(f"    {n:9,.0f}  {what}")
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
