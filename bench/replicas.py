"""Replicas behind a connection-level balancer vs picked by the gateway.

    .venv/bin/python bench/replicas.py [--runs 10] [--hold 1] [--seed N]

Two stub replicas (`--max-num-seqs 4`: vLLM's scheduler, 4 sequence slots each) and a gateway
with admission capped below the slots (cap 6 < 8 slots, queue 8). Each run is one fresh gateway process
and one round of 40 concurrent requests (half `/v1`, half `/llm`):

- `balancer`: the upstream's `url` is a connection-level random TCP balancer
  (bench/tcp_balancer.py: what kube-proxy's iptables mode does to a ClusterIP Service) in
  front of the two replicas: the gateway's connections land where they land;
- `endpoints`: `[endpoints] urls` lists the two replicas: the gateway picks one with a free
  slot for every admitted request.

For each mode it prints the runs in which a replica queued a request inside (a stub `--log`
line with `waiting=` above 0) and the worst `waiting=` seen. With endpoints that count must
be 0 (the exit status is 1 otherwise). Behind the balancer it depends on how the gateway's
first 6 connections split (5 or 6 on one replica: 14 in 64 splits, about 1 run in 5): the
gateway keeps them alive, so later requests follow them. Loopback only; every run is bounded
in time (at most 50 runs, 60 s each).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tcp_balancer import TcpBalancer

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
REQUESTS = 40
RUN_LIMIT = 60.0  # seconds, at most, for one round
_WAITING = re.compile(r" waiting=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), out.get("PYTHONPATH")]))
    return out


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout}s")


def spawn(argv: list[str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("ab") as handle:
        return subprocess.Popen([sys.executable, "-m", "cli", *argv], stdout=handle,
                                stderr=subprocess.STDOUT, env=env(), cwd=ROOT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def gateway_toml(port: int, url: str, replicas: list[str] | None) -> str:
    text = (f'[server]\nlisten = "127.0.0.1:{port}"\naccess_log = false\n[ops]\nlisten = "127.0.0.1:0"\n'
            f'[upstreams.reasoning]\nurl = "{url}"\nmodels = ["reasoning"]\n'
            "[upstreams.reasoning.admission]\nsequence_slots = 8\nmax_in_flight = 6\nqueue_depth = 8\n"
            "queue_timeout_seconds = 30\n")
    if replicas:
        text += ("[upstreams.reasoning.endpoints]\nsequence_slots = 4\nmax_in_flight = 4\n"
                 "urls = [" + ", ".join(f'"{r}"' for r in replicas) + "]\n")
    return text


async def one_request(port: int, i: int) -> int:
    """One request on its own connection (HTTP/1.1, read to the end); the status."""
    v1 = i % 2 == 0
    path = "/v1/chat/completions" if v1 else "/llm/v1/messages"
    body = (b'{"model":"reasoning","messages":[{"role":"user","content":"hi"}]}' if v1 else
            b'{"model":"reasoning","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}')
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        head = await reader.readline()
        await reader.read()
        return int(head.split()[1])
    finally:
        writer.close()


async def round_of_load(port: int) -> list[int]:
    async with asyncio.timeout(RUN_LIMIT):
        return await asyncio.gather(*(one_request(port, i) for i in range(REQUESTS)))


def waiting_since(log: Path, offset: int) -> list[int]:
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [int(m.group(1)) for m in _WAITING.finditer(text)]


async def run_mode(
    mode: str, runs: int, replicas: list[str], logs: list[Path], work: Path, seed: int | None
) -> tuple[int, int, int]:
    """(runs where a replica queued inside, worst waiting=, requests answered 200)."""
    queued_runs = worst = ok = 0
    for run in range(runs):
        async with TcpBalancer(replicas, seed=None if seed is None else seed + run) as balancer:
            port = free_port()
            config = work / f"{mode}-{run}.toml"
            url = balancer.url if mode == "balancer" else "http://127.0.0.1:9"
            config.write_text(gateway_toml(port, url, replicas if mode == "endpoints" else None))
            gateway = spawn(["serve", "--config", str(config)], work / f"{mode}-{run}.out")
            try:
                await asyncio.to_thread(wait_ready, f"http://127.0.0.1:{port}/healthz", gateway)
                offsets = [log.stat().st_size for log in logs]
                statuses = await round_of_load(port)
            finally:
                stop(gateway)
        ok += statuses.count(200)
        waiting = [w for log, offset in zip(logs, offsets, strict=True) for w in waiting_since(log, offset)]
        worst = max([worst, *waiting])
        queued_runs += any(waiting)
        other = len(statuses) - statuses.count(200) - statuses.count(503)
        print(f"  {mode:9} run {run + 1:2}: {statuses.count(200)} x 200, {statuses.count(503)} x 503, "
              f"{other} other, worst waiting={max(waiting, default=0)}", flush=True)
        if other:
            raise SystemExit(f"{mode} run {run + 1}: answers other than 200 and 503: {sorted(set(statuses))}")
    return queued_runs, worst, ok


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each mode (default 10, at most 50)")
    parser.add_argument("--hold", type=float, default=1.0, help="the stubs' --hold, seconds (default 1)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the balancer's random picks: run i uses seed+i (default: unseeded, new every time)")
    args = parser.parse_args()
    runs = max(1, min(args.runs, 50))
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        work = Path(tmp)
        logs = [work / "replica-a.log", work / "replica-b.log"]
        ports = [free_port(), free_port()]
        stubs = [spawn(["stub", "--listen", f"127.0.0.1:{p}", "--max-num-seqs", "4", "--hold", str(args.hold),
                        "--log", str(log)], work / f"stub-{p}.out") for p, log in zip(ports, logs, strict=True)]
        try:
            for p, stub in zip(ports, stubs, strict=True):
                wait_ready(f"http://127.0.0.1:{p}/health", stub)
            replicas = [f"http://127.0.0.1:{p}" for p in ports]
            print(f"2 replicas x --max-num-seqs 4 (hold {args.hold:g} s), cap 6, queue 8, "
                  f"{REQUESTS} concurrent requests per run, {runs} runs of each mode")
            results = {mode: await run_mode(mode, runs, replicas, logs, work, args.seed)
                       for mode in ("balancer", "endpoints")}
        finally:
            for stub in stubs:
                stop(stub)
    print(f"\n{'mode':10} {'runs where a replica queued inside':>36} {'worst waiting=':>15} {'200s':>6}")
    for mode, (queued, worst, ok) in results.items():
        print(f"{mode:10} {f'{queued} of {runs}':>36} {worst:>15} {ok:>6}")
    return 0 if results["endpoints"][0] == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
