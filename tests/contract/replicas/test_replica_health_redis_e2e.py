"""Replica health over the shared ledger: three gateway processes on one real Redis,
three stub replicas, one of which starts failing. Every process ejects it on its own (ejection
is each process's view), every client still gets 200 because each failed call's lease moves,
in Redis, to another replica (the Lua `move`), and no replica ever holds more than its slots:
the replicas' own gauges are polled during the load."""

from __future__ import annotations

import asyncio
import collections
from functools import partial
from pathlib import Path

from tests.contract.admission.e2e_support import Reply, call, http_client, until
from tests.contract.replicas.test_replica_health_e2e import access_log, health_toml, log_lines
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes
from tests.support.redis_server import RedisServer
from tests.support.replicas import polling

from domain.replicas import endpoint_of


async def load(gateways: list[Proc], rounds: int) -> list[Reply]:
    """`rounds` x 8 requests, 8 at a time over 3 x 4 slots (room is left for the retry), spread
    over the processes and both dialects."""
    replies: list[Reply] = []
    async with http_client() as c:
        for r in range(rounds):
            replies += await asyncio.gather(*(
                call(c, gateways[i % len(gateways)], "v1" if i % 2 else "llm", "reasoning", stream=(i + r) % 4 >= 2)
                for i in range(8)))
    return replies


async def test_three_processes_on_redis_retry_around_a_failing_replica_and_eject_it(
    procs: Processes, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        *good, bad = procs.together([
            *(partial(procs.stub, "--max-num-seqs", "4", "--hold", "0.05", log=tmp_path / f"{n}.log") for n in "ab"),
            partial(procs.stub, "--max-num-seqs", "4", "--fault", "reset-before-headers", "--fault-after", "6",
                    log=tmp_path / "c.log")])
        urls = [s.url for s in (*good, bad)]
        shared = f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
        toml = shared + health_toml(urls, consecutive_failures=3, base_ejection_seconds=30, load_metrics=False)
        gateways = procs.together(partial(procs.gateway, toml) for _ in range(3))
        async with polling(urls) as held:
            replies = await load(gateways, rounds=8)

        statuses = collections.Counter(r.status for r in replies)
        assert statuses == {200: len(replies)}, [r.text for r in replies if r.status != 200][:3]
        assert max(held.peak_each.values()) <= 4, held.peak_each  # never over a replica's slots

        endpoint = endpoint_of(bad.url)
        logged = [entry for gw in gateways for entry in access_log(gw)]
        retried = [e for e in logged if e["retried_from"] is not None]
        assert retried and {e["retried_from"] for e in retried} == {endpoint}
        assert {e["endpoint"] for e in retried} <= {endpoint_of(s.url) for s in good}
        assert sum(e["endpoint"] == endpoint for e in logged) == 6  # --fault-after 6, then never again
        ejecting = [gw for gw in gateways if log_lines(gw, "ejected for")]
        assert ejecting, "no process ejected the failing replica"

        async with http_client() as c:
            async def settled() -> bool:  # every slot came back, on every replica, in every view
                for gw in gateways:
                    page = samples((await c.get(gw.ops_url + "/metrics")).text)
                    if any(v for name, _, v in page if name == "gateway_endpoint_in_flight"):
                        return False
                return True

            await until(settled, "the shared per-replica counts back at 0")
    finally:
        redis.stop()
