"""vLLM's own load through a real gateway process, against a loopback replica that serves vLLM
0.32's `/metrics` page (`tests/fixtures/vllm-0.32-metrics.txt`, about 55 KB) with the
scheduler gauges a test sets, and a real stub replica beside it.

- The page answered in 0.8 s (a busy vLLM) is read within the default 1 s interval: requests
  waiting for capacity hold the replica back; requests only deferred (waiting for a grammar or
  an adapter, vLLM's `reason="deferred"`) do not.
- A replica held back by its last good report gets traffic again once that report is 2
  intervals old, while every read since has failed (fail static, bounded)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from aiohttp import web
from tests.contract.admission.e2e_support import call, http_client, until
from tests.contract.replicas.test_replica_health_e2e import health_toml, log_lines
from tests.support.fake_chat import chat_answer
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes
from tests.support.vllm_page import Engine, vllm_page

from domain.replicas import endpoint_of


@dataclass
class FakeVllm:
    """A loopback replica answering chat at once; `/metrics` serves `page` after `delay`
    seconds, or 500 when `page` is None. `chats` and `served` (good pages) are arrival times."""

    url: str = ""
    page: str | None = None
    delay: float = 0.0
    chats: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)


@contextlib.asynccontextmanager
async def fake_vllm(page: str, delay: float = 0.0) -> AsyncIterator[FakeVllm]:
    replica = FakeVllm(page=page, delay=delay)

    async def chat(request: web.Request) -> web.Response:
        replica.chats.append(time.monotonic())
        return await chat_answer(request)

    async def metrics(_: web.Request) -> web.Response:
        await asyncio.sleep(replica.delay)
        if replica.page is None:
            return web.Response(status=500, text="no")
        replica.served.append(time.monotonic())
        return web.Response(text=replica.page, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    replica.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield replica
    finally:
        await runner.cleanup()


async def reported(c: httpx.AsyncClient, gw: Proc, url: str) -> dict[str, float]:
    """`gateway_endpoint_reported{endpoint=url}` by kind (empty while the gateway has no fresh report)."""
    page = samples((await c.get(gw.ops_url + "/metrics")).text)
    return {labels["kind"]: value for name, labels, value in page
            if name == "gateway_endpoint_reported" and labels["endpoint"] == endpoint_of(url)}  # fmt: skip


async def test_a_slow_vllm_page_is_read_and_only_requests_waiting_for_capacity_hold_the_replica_back(
    procs: Processes, tmp_path: Path
) -> None:
    stub = procs.stub("--max-num-seqs", "4", log=tmp_path / "a.log")
    async with fake_vllm(vllm_page(Engine(running=1, capacity=2)), delay=0.8) as busy:
        gw = procs.gateway(health_toml([stub.url, busy.url]))  # load_metrics_interval_seconds: 1 (default)
        async with http_client() as c:
            async def holding_back() -> bool:
                return (await reported(c, gw, busy.url)).get("waiting") == 2

            await until(holding_back, "the slow page is read", timeout=6)
            replies = [await call(c, gw, "v1", "reasoning") for _ in range(8)]
            assert busy.chats == [], "a replica queueing for capacity got a request"

            busy.page = vllm_page(Engine(running=1, deferred=3))  # waiting, but not for room

            async def deferred_only() -> bool:
                return (await reported(c, gw, busy.url)) == {"running": 1, "waiting": 3, "deferred": 3}

            await until(deferred_only, "the deferred waiters are read", timeout=6)
            replies += [await call(c, gw, "v1", "reasoning") for _ in range(8)]
    assert {r.status for r in replies} == {200}
    assert len(busy.chats) >= 3, "a replica whose waiters are only deferred still gets requests"


async def test_a_replica_held_back_by_its_last_good_report_is_freed_two_intervals_after_it(
    procs: Processes, tmp_path: Path
) -> None:
    stub = procs.stub("--max-num-seqs", "4", log=tmp_path / "a.log")
    async with fake_vllm(vllm_page(Engine(running=0, capacity=16))) as busy:
        gw = procs.gateway(health_toml([stub.url, busy.url]))  # interval 1 s: a report counts 2 s
        async with http_client() as c:
            async def holding_back() -> bool:
                return (await reported(c, gw, busy.url)).get("waiting") == 16

            await until(holding_back, "the replica's queue is read", timeout=6)
            busy.page = None  # every read fails from now on: the last good one says "waiting 16"
            replies = []
            deadline = time.monotonic() + 6
            while not busy.chats and time.monotonic() < deadline:
                replies.append(await call(c, gw, "v1", "reasoning"))
                await asyncio.sleep(0.05)
            assert busy.chats, "still held back 6 s after its reads started failing"
            freed = busy.chats[0] - busy.served[-1]
            # 2 intervals, plus a request's way through a busy machine (3 or more: the report
            # counted 3 intervals and was dropped at a round's end)
            assert 1.8 < freed < 2.9, f"freed {freed:.2f} s after the last good read, not 2 intervals"
            assert await reported(c, gw, busy.url) == {}  # nothing stale is shown either
    assert {r.status for r in replies} == {200}
    assert len(log_lines(gw, "reading its load failed (HTTP 500)")) == 1
