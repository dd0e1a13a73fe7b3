"""KV-cache affinity: agents' time to first token with and without it.

    .venv/bin/python bench/affinity.py [--conversations 12] [--turns 5] [--rounds 2]
        [--system-words 3000] [--result-words 600] [--prefill-ms 50] [--redis URL]

Three stub replicas with `--prefix-cache` (vLLM's automatic prefix caching as timing shows it:
a request's first token waits `--prefill-ms` per 1,000 prompt tokens it does not find cached)
behind one gateway (`[endpoints] urls`, the three of them). `--conversations` agents at once,
`--turns` each, every turn re-sending the whole conversation plus the last answer and a new
tool result of `--result-words` (tests/support/conversations.py), after a system prompt of
`--system-words` every agent shares; every request streams. Two modes, each on fresh stubs
and a fresh gateway, `--rounds` times (the modes interleaved):

- `prefix`: `[endpoints] affinity = "prefix"` (the default);
- `off`: `affinity = "off"`: the least loaded replica, ties rotating.

It prints, per mode, the turn-weighted TTFT p50 / p90 (every turn counts once) over all turns
and over turns 2+, the mean prefilled (uncached) prompt tokens per later turn, and the share of
later turns served where their conversation's last turn was. `--redis URL` runs the admission
gate and the affinity memory on that Redis (`[admission] backend = "redis"`, a key prefix of
its own, deleted after), with 3 gateway processes that every conversation's turns rotate over.

Model server: the stub only. Against real llama.cpp servers (`llama-cpp-python[server]`, each
keeping its slots' prompt caches) it does not run here: see LLAMA_CPP below. Loopback only;
every run is bounded (at most 64 conversations x 20 turns, 120 s per run).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support.conversations import Turn, converse, percentile, placement, system_prompt  # noqa: E402
from tests.support.processes import Processes, upstream_toml  # noqa: E402
from tests.support.replicas import endpoints_toml  # noqa: E402

NOWHERE = "http://127.0.0.1:9"
LLAMA_CPP = ("llama.cpp: NOT RUN. `pip download llama-cpp-python` works here, but gives only the 0.3.36 "
             "sdist (76 MB, llama.cpp built with cmake at install), and it ships vocabulary-only GGUF files "
             "(vendor/llama.cpp/models/ggml-vocab-*.gguf, no weights); no model file can be fetched on this "
             "machine (only PyPI, Debian and npm are reachable), so there is nothing to serve. The figures "
             "below are the stub's.")  # fmt: skip


def config(urls: list[str], affinity: str, redis: str | None, prefix: str, conversations: int) -> str:
    cap = max(conversations * 2, 8)
    admission = {"sequence_slots": cap + 1, "max_in_flight": cap, "queue_depth": cap, "queue_timeout_seconds": 60}
    shared = f'[admission]\nbackend = "redis"\nredis_url = "{redis}"\nkey_prefix = "{prefix}"\n' if redis else ""
    return (shared + upstream_toml("agents", NOWHERE, ["agents"], admission)
            + endpoints_toml("agents", urls=urls, slots=cap, cap=cap) + f'affinity = "{affinity}"\n')  # fmt: skip


async def one_run(args: argparse.Namespace, affinity: str, seed: int) -> tuple[list[Turn], float, float]:
    """(turns, mean uncached tokens per later turn, share of later turns where the last one was)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-affinity-"))
    procs = Processes(workdir)
    prefix = f"bench-affinity-{uuid.uuid4().hex[:10]}"
    try:
        logs = [workdir / f"replica-{n}.log" for n in range(3)]
        stubs = [procs.stub("--prefix-cache", "--prefill-ms-per-1k-tokens", str(args.prefill_ms), "--tokens", "24",
                            log=log) for log in logs]  # fmt: skip
        toml = config([s.url for s in stubs], affinity, args.redis, prefix, args.conversations)
        gateways = [procs.gateway(toml) for _ in range(3 if args.redis else 1)]
        turns = await converse([g.url for g in gateways], "agents", conversations=args.conversations,
                               turns=args.turns, seed=seed, system=system_prompt(args.system_words),
                               result_words=args.result_words, stream=True, deadline=120.0)  # fmt: skip
        where = placement(logs)
        return turns, where.uncached(range(1, args.turns)), where.kept(range(1, args.turns))
    finally:
        procs.stop_all()
        if args.redis:
            from redis.asyncio import Redis

            client = Redis.from_url(args.redis)
            try:
                keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=500)]
                for key in keys:
                    await client.delete(key)
            finally:
                await client.aclose()


def row(mode: str, turns: list[Turn], uncached: float, kept: float) -> str:
    every = [t.ttft * 1000 for t in turns if t.status == 200]
    later = [t.ttft * 1000 for t in turns if t.status == 200 and t.turn > 0]
    failed = sum(t.status != 200 for t in turns)
    return (f"{mode:<8}{len(turns):>6}{failed:>7}{percentile(every, 50):>10.0f}{percentile(every, 90):>10.0f}"
            f"{percentile(later, 50):>10.0f}{percentile(later, 90):>10.0f}{uncached:>11.0f}{kept * 100:>9.0f}%")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=12, choices=range(1, 65), metavar="N")
    parser.add_argument("--turns", type=int, default=5, choices=range(2, 21), metavar="N")
    parser.add_argument("--rounds", type=int, default=2, choices=range(1, 11), metavar="N")
    parser.add_argument("--system-words", type=int, default=3000, help="shared system prompt (stub tokens = words)")
    parser.add_argument("--result-words", type=int, default=600, help="each tool result's words")
    parser.add_argument("--prefill-ms", type=float, default=50.0, help="stub: prefill ms per 1,000 uncached tokens")
    parser.add_argument("--redis", default=None, metavar="URL", help="the Redis backend, 3 gateway processes")
    args = parser.parse_args()
    print(LLAMA_CPP)
    backend = f"redis ({args.redis}), 3 gateway processes" if args.redis else "memory, 1 gateway process"
    print(f"model server: stub --prefix-cache --prefill-ms-per-1k-tokens {args.prefill_ms:g}, 3 replicas; "
          f"admission backend: {backend}")
    print(f"{args.conversations} conversations x {args.turns} turns, system prompt {args.system_words} words, "
          f"+{args.result_words}-word tool results, streamed, {args.rounds} round(s) per mode")
    print(f"{'mode':<8}{'turns':>6}{'failed':>7}{'p50 ms':>10}{'p90 ms':>10}{'2+ p50':>10}{'2+ p90':>10}"
          f"{'prefilled':>11}{'kept':>10}")
    modes = ("prefix", "off")
    turns: dict[str, list[Turn]] = {mode: [] for mode in modes}
    uncached: dict[str, list[float]] = {mode: [] for mode in modes}
    kept: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):  # the modes interleaved: a busy machine slows both alike
        for mode in modes:
            done, u, k = await one_run(args, mode, seed=round_ + 1)
            turns[mode] += done
            uncached[mode].append(u)
            kept[mode].append(k)
    for mode in modes:
        print(row(mode, turns[mode], sum(uncached[mode]) / args.rounds, sum(kept[mode]) / args.rounds), flush=True)
    print("p50/p90: TTFT over every turn (turn-weighted); 2+: turns 2 on; prefilled: mean uncached prompt "
          "tokens per turn 2+; kept: turns 2+ on the replica of their conversation's last turn")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
