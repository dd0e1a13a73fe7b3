"""Replicas end to end: real stub replicas with vLLM's scheduler (`--max-num-seqs 4`),
a real gateway with `[upstreams.reasoning.endpoints] urls`, clients on loopback.

The upstream's `url` points where nothing listens: every call must go to a replica. The
replicas' own gauges (`GET /metrics`) are polled during the load, so "in flight" is what the
model servers hold, not what the gateway believes."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from tests.contract.admission.e2e_support import Reply, call, http_client, until
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.replicas import endpoints_toml, polling, stub_lines

from domain.replicas import endpoint_of

NOWHERE = "http://127.0.0.1:9"  # the upstream's identity only: nothing listens there
SEED = {"sequence_slots": 8, "max_in_flight": 6, "queue_depth": 8, "queue_timeout_seconds": 30}


def replicas_toml(urls: list[str], admission: dict[str, float] | None = None) -> str:
    return upstream_toml("reasoning", NOWHERE, ["reasoning"], admission or SEED) + endpoints_toml(
        "reasoning", urls=urls)


async def load(gateways: list[Proc], n: int = 40) -> list[Reply]:
    """`n` requests at once, alternating /v1 and /llm, plain and streamed, spread over `gateways`."""
    async with http_client() as c:
        return await asyncio.gather(*(
            call(c, gateways[i % len(gateways)], "v1" if i % 2 else "llm", "reasoning", stream=i % 4 >= 2)
            for i in range(n)))


def check_replicas(logs: list[Path], replies: list[Reply], peak_each: dict[str, int], peak_sum: int) -> None:
    statuses = collections.Counter(r.status for r in replies)
    assert set(statuses) <= {200, 503}, [r.text for r in replies if r.status not in (200, 503)]
    assert statuses[200] >= 14, statuses  # the cap of 6 and the queue of 8 were all served
    assert all(r.headers.get("retry-after") for r in replies if r.status == 503)
    lines = [stub_lines(log) for log in logs]
    assert all(lines), "both replicas got requests"
    assert sum(map(len, lines)) == statuses[200]
    assert max(line.waiting for each in lines for line in each) == 0, "a request queued inside a replica"
    assert max(line.max_concurrent for each in lines for line in each) <= 4
    assert max(peak_each.values()) <= 4, peak_each
    assert peak_sum <= 6, peak_sum


async def test_two_replicas_each_get_at_most_their_slots_and_none_queues_inside(
    procs: Processes, tmp_path: Path
) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    stubs = procs.together(partial(procs.stub, "--max-num-seqs", "4", "--hold", "1", log=log) for log in logs)
    gw = procs.gateway(replicas_toml([s.url for s in stubs]))
    async with polling([s.url for s in stubs]) as held:
        replies = await load([gw])
    check_replicas(logs, replies, held.peak_each, held.peak_sum)
    assert held.polls > 20

    async with http_client() as c:
        page = samples((await c.get(gw.ops_url + "/metrics")).text)
        status = (await c.get(gw.ops_url + "/status.json")).json()
        page_html = (await c.get(gw.ops_url + "/status")).text
    endpoints = {endpoint_of(s.url) for s in stubs}
    sent = {labels["endpoint"]: v for name, labels, v in page if name == "gateway_endpoint_requests_total"}
    assert set(sent) == endpoints and sum(sent.values()) == sum(r.status == 200 for r in replies)
    assert {labels["endpoint"]: v for name, labels, v in page if name == "gateway_endpoint_in_flight"} == dict.fromkeys(
        endpoints, 0.0)
    states = {labels["state"]: v for name, labels, v in page if name == "gateway_upstream_endpoints"}
    assert states == {"ready": 2.0, "draining": 0.0, "ejected": 0.0}
    [upstream] = status["upstreams"]
    assert sorted(r["address"] for r in upstream["replicas"]) == sorted(s.url for s in stubs)
    assert {(r["state"], r["in_flight"], r["limit"]) for r in upstream["replicas"]} == {("ready", 0, 4)}
    assert all(f"<td>{s.url}</td>" in page_html for s in stubs)  # the status page lists each replica

    # The access log names each request's replica.
    logged = [json.loads(line) for line in gw.text().splitlines() if line.startswith('{"request_id"')]
    served = [entry for entry in logged if entry.get("status") == 200 and entry.get("upstream") == "reasoning"]
    assert served and {entry["endpoint"] for entry in served} == endpoints


async def test_three_processes_on_one_redis_keep_every_replica_within_its_slots(
    procs: Processes, tmp_path: Path
) -> None:
    from tests.support.redis_server import RedisServer

    redis = RedisServer(tmp_path)
    redis.start()
    try:
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        stubs = procs.together(partial(procs.stub, "--max-num-seqs", "4", "--hold", "1", log=log) for log in logs)
        shared = f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
        gateways = procs.together(partial(procs.gateway, shared + replicas_toml([s.url for s in stubs]))
                                  for _ in range(3))
        async with polling([s.url for s in stubs]) as held:
            replies = await load(gateways)
        check_replicas(logs, replies, held.peak_each, held.peak_sum)
    finally:
        redis.stop()


async def test_an_upstream_without_endpoints_still_calls_its_url(procs: Processes, tmp_path: Path) -> None:
    log = tmp_path / "stub.log"
    stub = procs.stub(log=log)
    gw = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], SEED))
    replies = await load([gw], 4)
    assert {r.status for r in replies} == {200}
    async with http_client() as c:
        text = (await c.get(gw.ops_url + "/metrics")).text
        ready = await c.get(gw.ops_url + "/readyz")
    assert "gateway_upstream_endpoints" not in text and "gateway_endpoint_" not in text
    assert ready.text == "ready\n"
    assert '"endpoint":null' in gw.text() and '"endpoint":"' not in gw.text()


async def test_a_killed_process_s_per_replica_slots_come_back(procs: Processes, tmp_path: Path) -> None:
    """SIGKILL one of two gateway processes while its requests hold slots on both replicas: after
    `lease_seconds` the survivors' view of every replica is empty again and both replicas take
    their full share once more."""
    from tests.support.redis_server import RedisServer

    redis = RedisServer(tmp_path)
    redis.start()
    try:
        stubs = procs.together(partial(procs.stub, "--max-num-seqs", "4", "--hold", "30", log=tmp_path / f"{n}.log")
                               for n in "ab")
        shared = f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\nlease_seconds = 2\n'
        victim, survivor = procs.together(partial(procs.gateway, shared + replicas_toml([s.url for s in stubs]))
                                          for _ in range(2))
        async with http_client() as c:
            held = [asyncio.create_task(call(c, victim, "v1", "reasoning")) for _ in range(4)]

            async def endpoint_in_flight() -> dict[str, float]:
                page = samples((await c.get(survivor.ops_url + "/metrics")).text)
                return {labels["endpoint"]: v for name, labels, v in page if name == "gateway_endpoint_in_flight"}

            await until(lambda: _sums_to(endpoint_in_flight, 4), "the victim holds 2 + 2")
            assert set((await endpoint_in_flight()).values()) == {2.0}
            victim.signal(signal.SIGKILL)
            await asyncio.gather(*held, return_exceptions=True)
            await until(lambda: _sums_to(endpoint_in_flight, 0), "the dead process's slots are reclaimed",
                        timeout=10)
            again = [asyncio.create_task(call(c, survivor, "llm", "reasoning")) for _ in range(6)]
            await until(lambda: _sums_to(endpoint_in_flight, 6), "the whole cap is usable again")
            assert set((await endpoint_in_flight()).values()) == {3.0}  # 3 + 3: both replicas' slots are free
            for task in again:  # hang up: the stubs abort them
                task.cancel()
            await asyncio.gather(*again, return_exceptions=True)
    finally:
        redis.stop()


async def _sums_to(read: Callable[[], Awaitable[dict[str, float]]], total: float) -> bool:
    return sum((await read()).values()) == total
