"""Fairness by requests (`fair`) against fairness by tokens (`tokens`), with the stub paced like vLLM.

    .venv/bin/python bench/fairness.py [--seconds 60] [--warm-up 5] [--rows fair-1,tokens-1,...]
                                       [--chunk-delay 0.01] [--in-flight 4] [--keep DIR]

One upstream capped at 2 (`max_in_flight = 2`) in front of a stub paced like a GPU (a token every
`--chunk-delay` s, default 0.01, `--max-num-seqs 4`), API keys required, two consumers: A floods
400-token answers, B 20-token answers, all streamed, each with 4 requests in flight (twice the
cap: both usually have requests waiting). Rows (`--rows`, default all):

  fair-1             fair, one gateway process (memory gate)
  tokens-1           tokens, one gateway process
  fair-redis         fair, two gateway processes sharing one Redis (each flood split over both)
  tokens-redis       tokens, the same
  tokens-2to1        tokens, weights A:B = 2:1, one process
  tokens-2to1-redis  tokens, weights 2:1, two processes on Redis

Per row, over the measured window (after the warm-up), from the gateways' /metrics summed over
processes: each consumer's requests served, output tokens, weighted service (input + 2 x output)
and slot seconds, and A/B of weighted service and of requests, each divided by the weight ratio.
Verdicts: `tokens` puts A/B weighted within 0.8..1.25; `fair` puts A/B requests within 0.8..1.25,
hence A far more tokens (A/B weighted at least 5). Metering: the floods stop, every request
under way ends, and the output tokens the gateways counted since they started must equal what
the stub generated (its --log: requests started per consumer, times that consumer's answer).

A row whose gateway refuses to start prints `gateway refused to start: <its message>` and the
run goes on. Exit status 1 if a row could not run or a verdict or a metering check failed, else 0. Loopback only; every
row is bounded in time; every process is stopped at the end, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fairness_rig as rig
from targets import Procs

ROWS = {  # name -> (fairness, gateway processes, weights of A and B)
    "fair-1": ("fair", 1, (1, 1)),
    "tokens-1": ("tokens", 1, (1, 1)),
    "fair-redis": ("fair", 2, (1, 1)),
    "tokens-redis": ("tokens", 2, (1, 1)),
    "tokens-2to1": ("tokens", 1, (2, 1)),
    "tokens-2to1-redis": ("tokens", 2, (2, 1)),
}
# Requests each consumer keeps in flight (split over the row's gateways): twice the cap, what a
# client keeping its share busy realistically does. Its queue then empties for a moment now and
# then (its two streams end in the same step) while its requests still hold both slots: it is
# not idle, so it is not lifted and keeps the deficit it is catching up on (docs/operations.md,
# "the lift"; bench/README.md).
WORKERS = 4
BOTH_SERVED = 60.0  # s, at most, until both consumers had an answer (before the warm-up)
DRAIN = 180.0  # s, at most, for the requests under way when the floods stop
SETTLE = 5.0  # s, at most, for the gateways' counters of the last answers after the drain
BAND = (0.8, 1.25)
FAR_MORE = 5.0  # under `fair`, A/B weighted (over the weight ratio) at least this


@dataclass
class Row:
    name: str
    fairness: str
    processes: int
    weights: dict[str, int]
    refused: str | None = None  # the gateway's own words when it would not start
    broken: str | None = None  # the row could not be measured (a process or the floods failed)
    window: dict[str, rig.Use] = field(default_factory=dict)
    counted: dict[str, float] = field(default_factory=dict)  # output tokens since start, the gateways'
    generated: dict[str, int] = field(default_factory=dict)  # output tokens the stub generated
    started: dict[str, int] = field(default_factory=dict)
    failed: str = ""  # what went wrong in the floods or the drain, if anything

    def ratio(self, what: str) -> float:
        a, b = (getattr(self.window[w], what) if what == "requests" else self.window[w].weighted() for w in rig.WHO)
        return (a / b if b else float("inf")) / (self.weights["A"] / self.weights["B"])


async def measure(row: Row, gateways: list[rig.Gateway], keys: dict[str, str], log: Path,
                  args: argparse.Namespace) -> None:
    stop, tally = asyncio.Event(), rig.Tally()
    limits = httpx.Limits(max_connections=4 * args.in_flight)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as c:
        tasks = [asyncio.create_task(rig.flood(c, gateways[i % len(gateways)], who, keys[who], stop, tally))
                 for who in rig.WHO for i in range(args.in_flight)]
        try:
            try:
                await asyncio.wait_for(tally.both_served.wait(), BOTH_SERVED)
            except TimeoutError:
                raise RuntimeError(f"not both consumers served in {BOTH_SERVED:.0f} s: {tally.last_failure}") from None
            await asyncio.sleep(args.warm_up)
            before = await rig.use(c, gateways)
            await asyncio.sleep(args.seconds)
            after = await rig.use(c, gateways)
            row.window = {who: after[who].minus(before[who]) for who in rig.WHO}
            stop.set()
            _, pending = await asyncio.wait(tasks, timeout=DRAIN)
            if pending:
                row.failed = f"{len(pending)} requests still under way {DRAIN:.0f} s after the floods stopped"
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if any(tally.failed.values()):
            row.failed += f" failed requests {tally.failed}, last: {tally.last_failure}"
        row.started = rig.stub_started(log)
        row.generated = {who: n * rig.ANSWER[who] for who, n in row.started.items()}
        # a gateway counts a request's tokens as its answer ends, a moment after the client
        # read the last bytes: read again until the counts are in (bounded; no tolerance)
        deadline = asyncio.get_running_loop().time() + SETTLE
        while True:
            total = await rig.use(c, gateways)
            row.counted = {who: total[who].output for who in rig.WHO}
            if row.counted == row.generated or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.1)


async def run_row(row: Row, work: Path, redis: str | None, args: argparse.Namespace) -> None:
    procs = Procs(work / row.name)
    procs.workdir.mkdir()
    try:
        stub_url, log = rig.start_stub(procs, "stub", args.chunk_delay)
        keys = {who: rig.new_key() for who in rig.WHO}
        keys_path = rig.keys_file(procs.workdir / "keys.toml", keys, row.weights)
        try:
            gateways = [rig.start_gateway(procs, f"gateway-{i + 1}", stub_url, keys_path, row.fairness, redis)
                        for i in range(row.processes)]
        except rig.Refused as refusal:
            row.refused = str(refusal)
            return
        await measure(row, gateways, keys, log, args)
    finally:
        procs.stop_all()  # the floods are over: blocking the loop a moment costs nothing


def verdicts(row: Row) -> list[tuple[bool, str]]:
    """(met, text) of the row's fairness verdict and of its metering cross-check."""
    weighted, requests = row.ratio("weighted"), row.ratio("requests")
    lo, hi = BAND
    if row.fairness == "tokens":
        out = [(lo <= weighted <= hi, f"tokens: A/B weighted service / weights {weighted:.2f}, within {lo}..{hi}")]
    else:
        out = [(lo <= requests <= hi and weighted >= FAR_MORE,
                f"fair: A/B requests / weights {requests:.2f}, within {lo}..{hi}; "
                f"hence A far more tokens: A/B weighted / weights {weighted:.1f} (at least {FAR_MORE:g})")]
    equal = all(row.counted[w] == row.generated[w] for w in rig.WHO)
    out.append((equal and not row.failed, "metering: gateway output tokens " + ", ".join(
        f"{w} {row.counted[w]:.0f}" for w in rig.WHO) + (" = " if equal else " != ") + "stub generated " + ", ".join(
        f"{w} {row.generated[w]} ({row.started[w]} x {rig.ANSWER[w]})" for w in rig.WHO)
        + (f"; {row.failed.strip()}" if row.failed else "")))
    return out


def table(rows: list[Row]) -> tuple[str, bool]:
    """The printed table and whether every verdict of the rows that ran was met."""
    lines = [f"{'row':18} {'who':3} {'weight':>6} {'requests':>9} {'output tok':>11} {'weighted':>10} "
             f"{'slot s':>7} {'A/B weighted/w':>15} {'A/B requests/w':>15}"]
    ok = True
    for row in rows:
        if row.refused is not None:
            lines.append(f"{row.name:18} gateway refused to start: {row.refused}")
            continue
        if row.broken is not None:
            ok = False
            lines.append(f"{row.name:18} MISSED, could not be measured: {row.broken}")
            continue
        for who in rig.WHO:
            u = row.window[who]
            ratios = (f" {row.ratio('weighted'):>15.2f} {row.ratio('requests'):>15.2f}" if who == "A" else "")
            lines.append(f"{row.name if who == 'A' else '':18} {who:3} {row.weights[who]:>6} {u.requests:>9.0f} "
                         f"{u.output:>11.0f} {u.weighted():>10.0f} {u.slot_seconds:>7.1f}{ratios}")
        for met, text in verdicts(row):
            ok = ok and met
            lines.append(f"{'':18}   {'met   ' if met else 'MISSED'} {text}")
    return "\n".join(lines), ok


async def run(args: argparse.Namespace, work: Path) -> list[Row]:
    rows = [Row(name, *ROWS[name][:2], dict(zip(rig.WHO, ROWS[name][2], strict=True))) for name in args.rows]
    shared = Procs(work)
    try:
        redis = rig.start_redis(shared) if any(row.processes > 1 for row in rows) else None
        for row in rows:
            print(f"  {row.name}: {row.fairness}, {row.processes} gateway process(es), weights "
                  f"{row.weights['A']}:{row.weights['B']} ...", flush=True)
            try:
                await run_row(row, work, redis if row.processes > 1 else None, args)
            except (RuntimeError, OSError, httpx.HTTPError) as error:
                row.broken = f"{type(error).__name__}: {error}"
                print(f"    could not be measured: {row.broken}", flush=True)
            if row.refused is not None:
                print(f"    gateway refused to start: {row.refused}", flush=True)
    finally:
        shared.stop_all()
    return rows


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per row (default 60, at most 600)")
    parser.add_argument("--warm-up", type=float, default=5.0, help="seconds after both were served (default 5)")
    parser.add_argument("--chunk-delay", type=float, default=0.01, help="the stub's s per token (default 0.01)")
    parser.add_argument("--in-flight", type=int, default=WORKERS,
                        help=f"requests each consumer keeps in flight (default {WORKERS}, at most 32)")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="write the configs and logs (stub --log, gateway output) under DIR, kept; default: a "
                        "temporary directory, removed")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)} (default all)")
    args = parser.parse_args()
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown or not args.rows:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    args.in_flight = min(max(args.in_flight, 1), 32)
    args.seconds, args.warm_up = min(max(args.seconds, 1.0), 600.0), min(max(args.warm_up, 0.0), 120.0)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (`cmd &`)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"fairness: cap {rig.CAP}, stub {args.chunk_delay * 1000:g} ms a token (--max-num-seqs {rig.SLOTS}), "
          f"A {rig.ANSWER['A']}-token and B {rig.ANSWER['B']}-token streams, {args.in_flight} in flight each; "
          f"{args.warm_up:g} s warm-up, {args.seconds:g} s measured per row", flush=True)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fairness-")))
        rows = asyncio.run(run(args, work))
    text, ok = table(rows)
    print("\n" + text)
    refused = [row.name for row in rows if row.refused is not None]
    print(f"\n{len(rows) - len(refused)} row(s) measured" + (f", refused to start: {', '.join(refused)}" if refused
          else "") + f"; every verdict {'met' if ok else 'NOT met'} ({time.monotonic() - began:.0f} s)")
    return 0 if ok and not refused else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("fairness: interrupted; every started process was stopped", file=sys.stderr)
        sys.exit(130)
