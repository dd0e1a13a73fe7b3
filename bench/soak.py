"""Chaos soak: a capped upstream, random faults, random hang-ups; nothing lost.

    .venv/bin/python bench/soak.py [--requests 3000] [--concurrency 14] [--seed 1] [--fault-rate 0.2]

Starts a stub upstream (`--fault random`) and a gateway on loopback (upstream capped at
4 in flight, queue 8, small timeouts), runs a warm-up round, then the soak, and prints the
figures: requests, hang-ups by phase, faults, the most requests the stub saw in flight,
the final ledger state, 500s, streams ended with / without their terminal frame, and the
gateway's RSS before and after. Exits 1 if an invariant fails. CI runs a short form
(`tests/contract/faults/test_chaos_soak.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

try:
    from bench import soak_driver as d  # imported as `bench.soak` (the CI short form)
except ImportError:  # run as a script: bench/ is on sys.path
    import soak_driver as d  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
RSS_SLACK_KIB = 8 * 1024  # allocator noise: arenas, caches filled by the first hundreds of requests
RSS_PER_REQUEST_KIB = 0.5  # beyond the slack: what growth per request would still pass


@dataclass
class Report:
    figures: d.Figures
    final: d.ServerState
    stub_started: int
    stub_max_in_flight: int
    faults: Counter[str]
    rss_before_kib: int
    rss_after_kib: int
    seconds: float  # of the soak itself (not the warm-up)

    @property
    def rss_growth_kib(self) -> int:
        return self.rss_after_kib - self.rss_before_kib

    @property
    def gateway_500s(self) -> float:
        """500s counted by the gateway (`gateway_requests_total`) or seen by the clients."""
        return max(self.final.statuses.get("500", 0), self.figures.statuses.get(500, 0))


async def soak(base: str, gateway_pid: int, stub_log: Path, *, requests: int, concurrency: int,
               seed: int, warmup: int, ops: str) -> Report:  # fmt: skip
    """A warm-up round, the RSS baseline, the soak, the ledger once settled, the RSS again.

    `ops` is the gateway's ops listener (its `/metrics`). Counters in the report are the
    soak's own (the warm-up's are subtracted); the stub's most-in-flight covers both."""
    await d.drive(base, warmup, concurrency, seed + 1, offset=10**7)
    baseline = await d.settled(ops)
    warm_started = d.stub_log(stub_log)[0]
    before = d.rss_kib(gateway_pid)
    started = time.monotonic()
    figures = await d.drive(base, requests, concurrency, seed)
    seconds = time.monotonic() - started
    final = (await d.settled(ops)).since(baseline)
    after = d.rss_kib(gateway_pid)
    count, most, faults = d.stub_log(stub_log, warm_started)
    return Report(figures, final, count, most, faults, before, after, seconds)


def problems(report: Report, cap: int = d.CAP) -> list[str]:
    """Every broken invariant, as a sentence (empty: the soak passed)."""
    f, out = report.figures, []
    if report.stub_max_in_flight > cap:
        out.append(f"the stub saw {report.stub_max_in_flight} requests in flight (cap {cap})")
    if report.final.slots_in_use != 0 or report.final.queue_depth != 0:
        out.append(f"ledger not empty: slots {report.final.slots_in_use}, queue {report.final.queue_depth}")
    if report.gateway_500s:
        out.append(f"{report.gateway_500s:g} responses were 500")
    if f.streams_unterminated:
        out.append(f"{f.streams_unterminated} completed streams had no terminal frame: {f.unterminated_samples}")
    if f.stuck or f.statuses.get(-1):
        out.append(f"{f.stuck} requests stuck, {f.statuses.get(-1, 0)} broken connections")
    limit = RSS_SLACK_KIB + RSS_PER_REQUEST_KIB * f.requests
    if report.rss_growth_kib > limit:
        out.append(f"gateway RSS grew by {report.rss_growth_kib} KiB (limit {limit:g} KiB)")
    return out


def describe(report: Report) -> str:
    f, final = report.figures, report.final
    per_request = report.rss_growth_kib * 1024 / max(1, f.requests)
    lines = [
        f"requests            {f.requests} in {report.seconds:.1f} s",
        f"statuses (read out) {dict(sorted(f.statuses.items()))}",
        f"hang-ups by phase   {dict(f.hang_ups)} (total {sum(f.hang_ups.values())}; before-response: queued "
        f"or waiting for the upstream); the gateway saw {final.admission.get('abandoned', 0):g} leave the queue",
        f"faults injected     {dict(report.faults)} (started requests; http-4xx/5xx are not started)",
        f"upstream errors     {final.upstream_errors}",
        f"stub                {report.stub_started} chat requests started, max in flight {report.stub_max_in_flight} "
        f"(cap {d.CAP})",
        f"ledger at the end   slots_in_use {final.slots_in_use:g}, queue_depth {final.queue_depth:g}",
        f"admission           {final.admission}",
        f"gateway statuses    {final.statuses}",
        f"500s                {report.gateway_500s:g}",
        f"streams completed   {f.streams_terminated + f.streams_unterminated}: "
        f"{f.streams_terminated} with a terminal frame ({f.streams_error_ended} of them an error frame), "
        f"{f.streams_unterminated} without",
        f"stuck / broken      {f.stuck} / {f.statuses.get(-1, 0)}",
        f"gateway RSS         {report.rss_before_kib} KiB after warm-up, {report.rss_after_kib} KiB after the soak "
        f"({report.rss_growth_kib:+d} KiB, {per_request:+.0f} B per request)",
    ]
    return "\n".join(lines)


# --- processes (the CI short form uses the test suite's fixtures instead) ----------------


def _start(argv: list[str], output: Path, health: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    with output.open("wb") as handle:
        proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[3]} exited with {proc.returncode}; see {output}")
        try:
            with urllib.request.urlopen(health, timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{health} did not answer within 30 s; see {output}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    stub_port, gateway_port, ops_port = d.free_port(), d.free_port(), d.free_port()
    log = workdir / "stub.log"
    stub_argv = [sys.executable, "-m", "stub", "--listen", f"127.0.0.1:{stub_port}",
                 *d.stub_args(args.seed, args.fault_rate), "--log", str(log)]  # fmt: skip
    config = workdir / "gateway.toml"
    config.write_text(f'[server]\nlisten = "127.0.0.1:{gateway_port}"\n{d.SERVER_EXTRA}'
                      f'\n[ops]\nlisten = "127.0.0.1:{ops_port}"\n'
                      + d.upstream_toml(f"http://127.0.0.1:{stub_port}"))  # fmt: skip
    gateway_argv = [sys.executable, "-m", "bootstrap", "serve", "--config", str(config)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start(stub_argv, workdir / "stub.out", f"http://127.0.0.1:{stub_port}/health"))
        procs.append(_start(gateway_argv, workdir / "gateway.out", f"http://127.0.0.1:{gateway_port}/healthz"))
        report = asyncio.run(soak(f"http://127.0.0.1:{gateway_port}", procs[1].pid, log, requests=args.requests,
                                  concurrency=args.concurrency, seed=args.seed, warmup=args.warmup,
                                  ops=f"http://127.0.0.1:{ops_port}"))  # fmt: skip
        print(describe(report))
    finally:
        for proc in reversed(procs):
            _stop(proc)
    failed = problems(report)
    for line in failed:
        print("FAILED:", line)
    print(f"outputs in {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
