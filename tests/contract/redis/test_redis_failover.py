"""A Sentinel failover under load: the gateway follows the promoted replica by itself.

A real redis-server master + replica and three redis-sentinels on free loopback ports; a
gateway on `[admission] redis_sentinels` with a capped upstream (cap 2) under a bounded
load; the master is killed (SIGKILL). During the gap capped requests fail closed (503 +
Retry-After); the gateway serves again through the promoted replica within 15 s; the stub
never saw more than the cap in flight; afterwards every slot is back (nothing counted twice).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from tests.contract.admission.e2e_support import until
from tests.support.metrics import gauge, samples
from tests.support.processes import Processes, upstream_toml
from tests.support.redis_cluster import RedisSentinels

CHAT = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}


def _max_concurrent(log: Path) -> int:
    return max(int(part.split("=")[1]) for line in log.read_text().splitlines()
               for part in line.split() if part.startswith("max_concurrent="))


async def test_sentinel_failover_under_load(procs: Processes, tmp_path: Path) -> None:
    redis = RedisSentinels(tmp_path / "redis")
    redis.start()
    try:
        log = tmp_path / "stub.log"
        stub = procs.stub("--hold", "0.3", log=log)
        sentinels = ", ".join(f'"127.0.0.1:{port}"' for port in redis.sentinels)
        gw = procs.gateway(
            f'[admission]\nbackend = "redis"\nredis_sentinels = [{sentinels}]\n'
            f'redis_sentinel_master = "{redis.name}"\nlease_seconds = 10\n'
            + upstream_toml("reasoning", stub.url, ["reasoning"], {
                "sequence_slots": 3, "max_in_flight": 2, "queue_depth": 8, "queue_timeout_seconds": 5}))
        replies: list[tuple[float, int, str | None]] = []  # (sent at, status, Retry-After)
        stop_at = time.monotonic() + 40  # the load's bound, whatever happens
        killed_at: float | None = None

        async def client(c: httpx.AsyncClient) -> None:
            while time.monotonic() < stop_at:
                sent = time.monotonic()
                try:
                    response = await c.post(f"{gw.url}/v1/chat/completions", json=CHAT)
                except httpx.HTTPError:
                    replies.append((sent, 0, None))
                    await asyncio.sleep(0.05)
                    continue
                replies.append((sent, response.status_code, response.headers.get("retry-after")))
                if response.status_code != 200:
                    await asyncio.sleep(0.1)

        def recovered() -> float | None:
            after = [sent for sent, status, _ in replies if killed_at is not None and sent > killed_at + 0.5
                     and status == 200]
            return min(after) - killed_at if after and killed_at is not None else None

        def served(since: float) -> int:
            return sum(1 for sent, status, _ in replies if sent >= since and status == 200)

        async with httpx.AsyncClient(timeout=30) as c:
            load = [asyncio.create_task(client(c)) for _ in range(5)]
            await until(lambda: served(0.0) >= 4, "serving on the first master")
            redis.kill(redis.master)
            killed_at = time.monotonic()
            for _ in range(100):  # up to 20 s
                if recovered() is not None:
                    break
                await asyncio.sleep(0.2)
            if (back := recovered()) is not None:  # some more load on the new master (5 clients, cap 2)
                new_master_from = killed_at + back
                await until(lambda: served(new_master_from) >= 8, "more load served on the new master")
            stop_at = time.monotonic()
            await asyncio.gather(*load)
            back = recovered()
            assert back is not None and back <= 15, (back, replies[-20:])
            assert redis.current_master() == redis.replica
            gap = [(status, retry) for sent, status, retry in replies if sent > killed_at and status != 200]
            assert gap, "the failover left no gap at all?"
            print(f"served again {back:.1f} s after the kill; {len(gap)} requests refused (503) in the gap")
            assert all(status == 503 and retry is not None and int(retry) >= 1 for status, retry in gap), gap
            assert _max_concurrent(log) <= 2  # the cap held across the failover
            deadline = time.monotonic() + 15
            while True:  # every slot and queue place back (released late or reclaimed, never twice)
                page = samples((await c.get(gw.ops_url + "/metrics")).text)
                state = (gauge(page, "gateway_upstream_slots_in_use", "reasoning"),
                         gauge(page, "gateway_upstream_queue_depth", "reasoning"))
                if state == (0, 0):
                    break
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.2)
            both = await asyncio.gather(*(c.post(f"{gw.url}/v1/chat/completions", json=CHAT) for _ in range(2)))
            assert [r.status_code for r in both] == [200, 200]
            assert _max_concurrent(log) <= 2
    finally:
        procs.stop_all(wait=True)  # before its Redis: a gateway whose Sentinels are all gone takes 10 s to stop
        redis.stop()
