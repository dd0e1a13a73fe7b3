"""A client cannot grow `/metrics` or the traces by choosing model names.

With an alias pattern (`claude-sonnet-*`, as the README recommends), 10,000 distinct alias names
sent concurrently over loopback leave `/metrics` with the same series as before (only the
counts grow), and unknown names (404) add none either. The access log keeps each client's name.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tests.contract.operations.test_tracing import Receiver, _attrs
from tests.support.metrics import samples
from tests.support.processes import Proc, Processes, upstream_toml

NAMES = 10_000
WORKERS = 32
ALIASES = 'aliases = ["claude-sonnet-*"]\n'
_VALUE = re.compile(r" [^ ]+$")


def series(page: str) -> list[str]:
    """Every sample line without its value: the page's series, in order."""
    return [_VALUE.sub("", line) for line in page.splitlines() if line and not line.startswith("#")]


async def send(http: aiohttp.ClientSession, gateway: Proc, model: str, surface: str) -> int:
    user = [{"role": "user", "content": "hi"}]
    if surface == "v1":
        path, body = "/v1/chat/completions", {"model": model, "messages": user}
    elif surface == "llm":
        path, body = "/llm/v1/messages", {"model": model, "max_tokens": 4, "messages": user}
    else:
        path, body = "/llm/v1/messages/count_tokens", {"model": model, "messages": user}
    async with http.post(gateway.url + path, json=body) as response:
        await response.read()
        return response.status


async def send_all(http: aiohttp.ClientSession, gateway: Proc, work: list[tuple[str, str]]) -> list[int]:
    """`work` (model, surface) by WORKERS concurrent clients; bounded by count and by time."""
    statuses: list[int] = []
    queue = iter(work)

    async def worker() -> None:
        for model, surface in queue:
            statuses.append(await send(http, gateway, model, surface))

    async with asyncio.timeout(300):
        await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return statuses


async def metrics(http: aiohttp.ClientSession, gateway: Proc) -> str:
    async with http.get(gateway.ops_url + "/metrics") as response:
        assert response.status == 200
        return await response.text()


@pytest.mark.slow
async def test_ten_thousand_alias_names_leave_the_metrics_page_unchanged(procs: Processes) -> None:
    stub = procs.stub("--tokens", "2")
    gateway = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning", "r2"], extra=ALIASES),
                            server_extra="queue_events = true")  # fmt: skip
    connector = aiohttp.TCPConnector(limit=WORKERS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:
        # Every kind of answer once, so that each series the run can touch exists already.
        surfaces = ("v1", "llm", "count")
        warm = [("claude-sonnet-warm", s) for s in surfaces] + [("r2", "v1")] + [("gpt-warm", s) for s in surfaces]
        assert sorted(await send_all(http, gateway, warm)) == [200, 200, 200, 200, 404, 404, 404]
        before = await metrics(http, gateway)
        work = [(f"claude-sonnet-{i}", surfaces[i % 3]) for i in range(NAMES)]
        work += [(f"gpt-{i}", surfaces[i % 3]) for i in range(300)]  # unknown: 404
        statuses = await send_all(http, gateway, work)
        after = await metrics(http, gateway)
    assert statuses.count(200) == NAMES and statuses.count(404) == 300, sorted(set(statuses))
    assert series(after) == series(before)
    assert "claude-sonnet-" not in after and "gpt-" not in after
    print(f"/metrics: {len(before)} bytes before, {len(after)} after {len(statuses)} requests")
    assert len(after) - len(before) < 2000, (len(before), len(after))  # only digits of the counts grew
    models = {labels["model"] for name, labels, _ in samples(after) if name == "gateway_tokens_total"}
    assert models == {"reasoning", "r2"}  # the configured names; an alias is its upstream's first name
    access = [json.loads(line) for line in gateway.text().splitlines() if line.startswith('{"request_id"')]
    logged = {(record["model"], record["upstream_model"]) for record in access}
    assert ("claude-sonnet-9999", "reasoning") in logged and ("gpt-299", None) in logged


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    collector = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", collector.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield collector, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_spans_carry_the_clients_name_within_its_bound_and_call_the_configured_one(
    procs: Processes, receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    collector, endpoint = receiver
    stub = procs.stub("--tokens", "2")
    gateway = procs.gateway(upstream_toml("reasoning", stub.url, ["reasoning"], extra=ALIASES),
                            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})  # fmt: skip
    name = "claude-sonnet-" + "x" * 242  # 256 characters
    async with aiohttp.ClientSession() as http:
        for model, status in ((name, 200), (name + "x", 400), ("claude-sonnet-" + "y" * 30_000, 400)):
            headers: dict[str, Any] = {"x-request-id": f"len-{len(model)}"}
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(gateway.url + "/v1/chat/completions", json=body, headers=headers) as response:
                assert response.status == status
    spans = await collector.wait_for({"POST /v1/chat/completions", "chat reasoning"})
    servers = await _server_spans(collector, 3)
    attributes = {_attrs(s)["gateway.request_id"]: _attrs(s) for s in servers}
    assert attributes["len-256"]["gen_ai.request.model"] == name
    assert "gen_ai.request.model" not in attributes["len-257"]  # refused before it was a model
    assert "gen_ai.request.model" not in attributes[f"len-{30_014}"]
    assert _attrs(spans["chat reasoning"])["gen_ai.request.model"] == "reasoning"
    longest = max(len(str(v)) for s in collector.spans for v in _attrs(s).values())
    assert longest <= 256


async def _server_spans(collector: Receiver, count: int) -> list[Any]:
    async with asyncio.timeout(15):
        while True:
            servers = [s for s in collector.spans if s.name == "POST /v1/chat/completions"]
            if len(servers) >= count:
                return servers
            collector.arrived.clear()
            await collector.arrived.wait()
