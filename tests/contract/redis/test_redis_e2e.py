"""Several `gateway serve` processes on one Redis share ONE cap and ONE FIFO queue.

Each test runs its own redis-server on a free loopback port (so stopping it does
not disturb anything else) and real stub and gateway processes.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from functools import partial
from pathlib import Path

import aiohttp
from tests.support.processes import Processes, upstream_toml
from tests.support.redis_server import RedisServer

V1 = {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}
LLM = {"model": "reasoning", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _toml(redis: RedisServer, stub_url: str, cap: int, depth: int, *, lease: float = 10.0,
          timeout: float = 30, models: list[str] | None = None, extra: str = "") -> str:
    return (
        f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\nlease_seconds = {lease}\n'
        + upstream_toml("reasoning", stub_url, models or ["reasoning"], {
            "sequence_slots": cap + 1, "max_in_flight": cap, "queue_depth": depth,
            "queue_timeout_seconds": timeout})
        + extra
    )


async def _post(http: aiohttp.ClientSession, url: str, surface: str, model: str = "reasoning") -> int:
    body = dict(V1 if surface == "v1" else LLM, model=model)
    path = "/v1/chat/completions" if surface == "v1" else "/llm/v1/messages"
    async with http.post(url + path, json=body) as response:
        await response.read()
        return response.status


def _max_concurrent(log: Path) -> int:
    return max(int(part.split("=")[1]) for line in log.read_text().splitlines()
               for part in line.split() if part.startswith("max_concurrent="))


async def test_three_processes_share_one_cap(procs: Processes, redis: RedisServer, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "2", log=log)
    gateways = procs.together(partial(procs.gateway, _toml(redis, stub.url, cap=6, depth=8)) for _ in range(3))
    async with aiohttp.ClientSession() as http:
        statuses = await asyncio.gather(*(
            _post(http, gateways[i % 3].url, "v1" if i % 2 else "llm") for i in range(60)))
    counts = collections.Counter(statuses)
    assert set(counts) <= {200, 503}, counts
    assert counts[200] >= 6 and counts[503] >= 60 - 6 - 8 * 2, counts  # one cap, one queue for all
    assert _max_concurrent(log) == 6
    assert "max_concurrent=7" not in log.read_text()


async def test_arrival_order_holds_across_processes(procs: Processes, redis: RedisServer, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "0.6", log=log)
    models = [f"m{i}" for i in range(6)]
    gateways = procs.together(partial(procs.gateway, _toml(redis, stub.url, cap=1, depth=8, models=models))
                              for _ in range(3))
    async with aiohttp.ClientSession() as http:
        tasks = []
        for i, model in enumerate(models):
            surface = "v1" if i % 2 else "llm"
            tasks.append(asyncio.create_task(_post(http, gateways[i % 3].url, surface, model)))
            await asyncio.sleep(0.1)
        assert await asyncio.gather(*tasks) == [200] * 6
    seen = [line.split('model="')[1].split('"')[0] for line in log.read_text().splitlines()]
    assert seen == models
    assert "in_flight=2" not in log.read_text()


async def test_killed_process_gives_its_slots_back(procs: Processes, redis: RedisServer, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "20", log=log)
    victim, survivor = procs.together(partial(procs.gateway, _toml(redis, stub.url, cap=2, depth=4, lease=1.0))
                                      for _ in range(2))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        held = [asyncio.create_task(_post(http, victim.url, "v1")) for _ in range(2)]
        await _wait_lines(log, 2)
        waiting = asyncio.create_task(_post(http, survivor.url, "llm"))
        await asyncio.sleep(0.3)
        assert len(log.read_text().splitlines()) == 2  # queued behind the victim's slots
        victim.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await _wait_lines(log, 3, timeout=10)
        assert time.monotonic() - killed_at < 1.0 + 2.5  # lease + heartbeat/recheck slack
        waiting.cancel()
        for task in held:
            task.cancel()
        await asyncio.gather(waiting, *held, return_exceptions=True)


async def test_redis_down_fails_closed_and_recovers(procs: Processes, redis: RedisServer) -> None:
    stub, other = procs.together([procs.stub, procs.stub])
    gateway = procs.gateway(_toml(redis, stub.url, cap=2, depth=2, extra=upstream_toml("qwen", other.url, ["qwen"])))
    async with aiohttp.ClientSession() as http:
        assert await _post(http, gateway.url, "v1") == 200
        redis.stop()
        for surface in ("v1", "llm"):
            path = "/v1/chat/completions" if surface == "v1" else "/llm/v1/messages"
            async with http.post(gateway.url + path, json=V1 if surface == "v1" else LLM) as response:
                assert response.status == 503, await response.text()
                assert int(response.headers["retry-after"]) >= 1
        assert await _post(http, gateway.url, "v1", model="qwen") == 200  # uncapped keeps working
        redis.start()
        deadline = time.monotonic() + 15
        while await _post(http, gateway.url, "llm") != 200:
            assert time.monotonic() < deadline, "did not recover after Redis came back"
            await asyncio.sleep(0.2)
        assert await _post(http, gateway.url, "v1") == 200


async def test_workers_share_the_cap(procs: Processes, redis: RedisServer, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub("--hold", "1", log=log)
    gateway = procs.gateway(_toml(redis, stub.url, cap=3, depth=20), server_extra="workers = 2")
    async with aiohttp.ClientSession() as http:
        statuses = await asyncio.gather(*(_post(http, gateway.url, "v1" if i % 2 else "llm") for i in range(12)))
    assert statuses == [200] * 12
    assert _max_concurrent(log) == 3
    gateway.signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.popen.wait, 15) == 0


def _lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def _wait_lines(log: Path, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _lines(log) < count:
        assert time.monotonic() < deadline, f"stub never saw {count} requests"
        await asyncio.sleep(0.02)
