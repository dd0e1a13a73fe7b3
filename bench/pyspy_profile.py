"""Profile the gateway under load with py-spy: where does the time go?

    .venv/bin/pip install py-spy          # once (not a project dependency)
    .venv/bin/python bench/pyspy_profile.py --scenario v1 --concurrency 64 --seconds 10
    .venv/bin/python bench/pyspy_profile.py --scenario paced-llm --streams 200 --seconds 10

Starts the stub (CPU 0, with wrk) and the gateway (CPU 1), drives one scenario with wrk and
samples the gateway with `py-spy record` meanwhile. Writes bench/out/profile-<scenario>.svg
(flame graph) and .txt (collapsed stacks), and prints the top functions by self and by
inclusive share of the samples, and the self share per package. Loopback only; bounded.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import drive
import paced
import peers
import targets as t

OUT = Path(__file__).resolve().parent / "out"
PACED = {"paced-v1": drive.SCENARIOS[1], "paced-llm": drive.SCENARIOS[2]}
PACKAGES = [  # (label, pattern on the frame's file as py-spy shortens it); first match wins
    ("gateway src",
     re.compile(r"^(adapters|application|domain|ports|wiring)/|^(bootstrap|cli|serving|config|demo)\.py")),
    ("litestar", re.compile(r"^litestar/")), ("uvicorn", re.compile(r"^uvicorn/")),
    ("aiohttp (+yarl, multidict)", re.compile(r"^(aiohttp|yarl|multidict)/")),
    ("msgspec", re.compile(r"msgspec")), ("opentelemetry", re.compile(r"^opentelemetry/")),
    ("prometheus_client", re.compile(r"^prometheus_client/")), ("logging", re.compile(r"^logging/")),
    ("asyncio (Python part)", re.compile(r"^asyncio/")),
]
LOOP = "event loop + socket I/O in C (uvloop; leaf = Runner.run)"
STDLIB = ("other stdlib", "asyncio (Python part)", "logging", LOOP)
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def package(func: str, path: str) -> str:
    if func == "Runner.run":
        return LOOP
    return next((label for label, pattern in PACKAGES if pattern.search(path)), "other stdlib")


def summarise(collapsed: Path, top: int) -> str:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    charged: collections.Counter[str] = collections.Counter()  # stdlib time charged to its caller
    charged_package: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if FRAME.match(f)]
        if not frames:
            continue
        total += count
        names = []
        for frame in frames:
            m = FRAME.match(frame)
            assert m is not None
            short = re.sub(r"^.*/(site-packages|src|lib/python3\.\d+)/", "", m["file"])
            names.append(f"{m['func']} ({short})")
        self_time[names[-1]] += count
        full = list(names)
        # Inclusive time below the event loop: the frames above it are in every sample.
        below = [i for i, name in enumerate(names) if name.startswith("Runner.run ")]
        if below:
            names = names[below[0] + 1:] or names[-1:]
        leaf = FRAME.match(frames[-1])
        assert leaf is not None
        by_package[package(leaf["func"], leaf["file"])] += count
        for frame, name in zip(reversed(frames), reversed(full), strict=True):
            m = FRAME.match(frame)
            assert m is not None
            where = package(m["func"], m["file"])
            if where not in STDLIB or where == LOOP:
                charged_package[where] += count
                charged[re.sub(r":\d+\)$", ")", name)] += count
                break
        else:
            charged_package["other stdlib"] += count
        for name in set(names):
            inclusive[name] += count
    if not total:
        return "no samples"

    def block(title: str, counter: collections.Counter[str]) -> list[str]:
        return [title] + [f"  {100 * n / total:5.1f}%  {name}" for name, n in counter.most_common(top)]

    lines = [f"{total} samples (on-CPU only; stacks py-spy could not unwind fully count for self time only)"]
    lines += block("self time by package:", by_package)
    lines += block(f"top {top} functions by self time:", self_time)
    lines += block(f"top {top} functions by inclusive time:", inclusive)
    lines += block("self time by package, stdlib (asyncio, copy, ...) charged to the package calling it:",
                   charged_package)
    lines += block(f"top {top} functions, own time + the stdlib they call:", charged)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=[s.key for s in drive.SCENARIOS] + list(PACED), default="v1",
                   help="paced-v1 / paced-llm: --streams paced streams (50 tokens at 50/s) instead of wrk")
    p.add_argument("--streams", type=int, default=200, help="paced: concurrent streams")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--target", choices=["ours", "keyed", "ceiling"], default="ours",
                   help="ceiling: bench/ceiling.py, one Litestar handler relaying through aiohttp; "
                   "keyed: ours with API keys and consumer limits on")
    p.add_argument("--summarise", metavar="TXT", help="only print the summary of a recorded .txt")
    args = p.parse_args(argv)
    if args.summarise:
        print(summarise(Path(args.summarise), args.top))
        return 0
    seconds = min(args.seconds, 60.0)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(py_spy, os.X_OK) or drive.wrk_binary() is None:
        print("profile: needs py-spy (.venv/bin/pip install py-spy) and wrk (bench/run installs it)")
        return 2
    scenario = PACED[args.scenario] if args.scenario in PACED else next(
        s for s in drive.SCENARIOS if s.key == args.scenario)
    is_paced = args.scenario in PACED
    cpus = sorted(os.sched_getaffinity(0))
    load, target = ({cpus[0]}, {cpus[1]}) if len(cpus) > 1 else (None, None)
    OUT.mkdir(exist_ok=True)
    stem = OUT / (f"profile-{args.target}-{args.scenario}-{args.streams}" if is_paced
                  else f"profile-{args.target}-{args.scenario}-c{args.concurrency}")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        procs = t.Procs(Path(tmp))
        try:
            if is_paced:
                stub = t.start_stub(procs, load, paced.TOKENS, paced.CHUNK_DELAY)
            else:
                stub = t.start_stub(procs, load, 20)
            start = {"ceiling": peers.start_ceiling, "keyed": t.start_keyed_gateway}.get(args.target, t.start_gateway)
            gateway = start(procs, target, stub.url)
            url = gateway.url + (drive.path_for(scenario, gateway.messages_path) or "")
            streams = max(1, min(args.streams, 800))
            rounds = max(1, round(seconds))  # an answer takes about a second
            if is_paced:
                paced.drive_streams(url, scenario.body(), streams, 1, load, gateway.pids())  # warm-up
            else:
                drive.run_load(url, scenario, gateway.headers, args.concurrency, 2, Path(tmp), load, "wrk")
            assert gateway.proc is not None
            spy = [py_spy, "record", "--pid", str(gateway.proc.pid), "--rate", str(args.rate),
                   "--duration", str(round(seconds)), "--nonblocking"]
            recorders = [subprocess.Popen([*spy, "--format", fmt, "-o", f"{stem}.{ext}"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                         for fmt, ext in (("flamegraph", "svg"), ("raw", "txt"))]
            if is_paced:
                result = paced.drive_streams(url, scenario.body(), streams, rounds + 1, load, gateway.pids())
                result["rps"] = result["completed"] / max(result["wall_s"], 1e-9)
            else:
                result = drive.run_load(url, scenario, gateway.headers, args.concurrency, seconds + 1, Path(tmp), load,
                                        "wrk")
            for recorder in recorders:
                recorder.wait(timeout=seconds + 30)
        finally:
            procs.stop_all()
    load_text = f"{args.streams} paced streams" if is_paced else f"c={args.concurrency}"
    print(f"{scenario.label} {load_text}: {result.get('rps', 0):.0f} req/s under py-spy "
          f"(two samplers at {args.rate} Hz slow it down); {stem}.svg")
    print(summarise(Path(f"{stem}.txt"), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
