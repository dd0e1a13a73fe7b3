"""CORS for the first-party browser frontend: configured origins only, nothing by default."""

from __future__ import annotations

import aiohttp
from tests.support.processes import Processes, upstream_toml

ORIGIN = "https://chat.riotpiao.com"
BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


async def test_allowed_origin_gets_preflight_and_headers(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]), server_extra=f'cors_allowed_origins = ["{ORIGIN}"]')
    async with aiohttp.ClientSession() as http:
        preflight = await http.options(f"{gateway.url}/llm/v1/messages", headers={
            "origin": ORIGIN, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,x-api-key,anthropic-version"})
        assert preflight.status in (200, 204)
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        response = await http.post(f"{gateway.url}/llm/v1/messages", json=BODY, headers={"origin": ORIGIN})
        assert response.status == 200
        assert response.headers["access-control-allow-origin"] == ORIGIN
        assert "request-id" in response.headers["access-control-expose-headers"]
        other = await http.post(f"{gateway.url}/llm/v1/messages", json=BODY,
                                headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


async def test_nothing_allowed_by_default(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]))
    async with aiohttp.ClientSession() as http:
        preflight = await http.options(f"{gateway.url}/llm/v1/messages", headers={
            "origin": ORIGIN, "access-control-request-method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers
        response = await http.post(f"{gateway.url}/llm/v1/messages", json=BODY, headers={"origin": ORIGIN})
        assert response.status == 200
        assert "access-control-allow-origin" not in response.headers
