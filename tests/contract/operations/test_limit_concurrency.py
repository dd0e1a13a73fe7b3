"""`server.limit_concurrency` reaches uvicorn: past it (open connections count), a request
gets uvicorn's plain-text 503, and the process serves again once connections close."""

from __future__ import annotations

import asyncio

import aiohttp
from tests.support.processes import Processes, upstream_toml


async def test_requests_past_limit_concurrency_get_a_plain_503(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]), server_extra="limit_concurrency = 2")
    _, idle = await asyncio.open_connection("127.0.0.1", gateway.port)  # holds one of the two
    await asyncio.sleep(0.2)  # let the server accept it
    async with aiohttp.ClientSession() as http:
        refused = await http.get(f"{gateway.url}/healthz")
        assert refused.status == 503
        assert refused.headers["content-type"].startswith("text/plain")
        assert await refused.text() == "Service Unavailable"
    idle.close()
    await idle.wait_closed()
    await asyncio.sleep(0.2)  # let the server see it go
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{gateway.url}/healthz")).status == 200
