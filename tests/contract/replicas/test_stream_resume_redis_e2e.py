"""Stream resume over the shared ledger: two gateway processes on one real Redis, two stub
replicas of 2 slots each that reset every stream after 5 tokens. Twelve streams at once, spread
over both processes and both dialects, all break twice and are resumed, their leases moved in
Redis (the Lua `move`), waiting while no replica has room: every client gets the whole answer,
no replica ever holds more than its slots (their own gauges, polled during the load), and every
slot comes back in every process's view."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path

import httpx
from tests.contract.admission.e2e_support import http_client, until
from tests.contract.replicas.test_replica_health_e2e import access_log
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml
from tests.support.redis_server import RedisServer
from tests.support.replicas import endpoints_toml, polling

ANSWER = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima"
MESSAGES = [{"role": "user", "content": "please answer at length"}]
SLOTS = 2
HELD = ("gateway_endpoint_in_flight", "gateway_upstream_slots_in_use")  # per replica, per upstream


async def streamed_text(c: httpx.AsyncClient, gw: Proc, surface: str) -> str:
    """The text of one streamed answer, from its raw SSE (an error event fails the test)."""
    if surface == "v1":
        path, body = "/v1/chat/completions", {"model": "reasoning", "messages": MESSAGES, "stream": True}
    else:
        path, body = "/llm/v1/messages", {"model": "reasoning", "max_tokens": 64, "messages": MESSAGES,
                                          "stream": True}  # fmt: skip
    text = []
    async with c.stream("POST", gw.url + path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            assert "error" not in data and data.get("type") != "error", data
            if surface == "v1" and data["choices"]:
                text.append(data["choices"][0]["delta"].get("content") or "")
            elif data.get("type") == "content_block_delta":
                text.append(data["delta"].get("text", ""))
    return "".join(text)


async def test_two_processes_on_redis_resume_every_stream_within_every_replicas_slots(
    procs: Processes, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        dying = ("--tokens", "12", "--max-num-seqs", str(SLOTS), "--chunk-delay", "0.01", "--fault", "die-mid-stream",
                 "--fault-after-tokens", "5")  # fmt: skip
        stubs = procs.together([partial(procs.stub, *dying), partial(procs.stub, *dying)])
        urls = [s.url for s in stubs]
        admission = {"sequence_slots": 2 * SLOTS + 1, "max_in_flight": 2 * SLOTS, "queue_depth": 16,
                     "queue_timeout_seconds": 30}  # fmt: skip
        toml = (f'[admission]\nbackend = "redis"\nredis_url = "{redis.url}"\n'
                + upstream_toml("reasoning", "http://127.0.0.1:9", ["reasoning"], admission)
                + endpoints_toml("reasoning", urls=urls, slots=SLOTS, cap=SLOTS) + "load_metrics = false\n")
        gateways = procs.together(partial(procs.gateway, toml) for _ in range(2))
        async with http_client() as c:
            async with polling(urls) as held:
                texts = await asyncio.gather(*(
                    streamed_text(c, gateways[i % 2], "v1" if i % 4 < 2 else "llm") for i in range(12)))
            assert texts == [ANSWER] * 12
            assert max(held.peak_each.values()) <= SLOTS, held.peak_each  # never over a replica's slots
            assert held.polls > 5

            await until(lambda: sum(len(access_log(gw)) for gw in gateways) == 12, "every answer logged")
            logged = [entry for gw in gateways for entry in access_log(gw)]
            assert {e["resumed"] for e in logged} == {2}, logged

            async def settled() -> bool:  # every slot came back, on every replica, in every view
                for gw in gateways:
                    page = samples((await c.get(gw.ops_url + "/metrics")).text)
                    if any(v for name, _, v in page if name in HELD):
                        return False
                return True

            await until(settled, "the shared per-replica counts back at 0")
    finally:
        redis.stop()
