"""Unknown paths under a surface answer 404 in that surface's own error shape."""

from __future__ import annotations

import aiohttp
from tests.support.processes import Processes, upstream_toml


async def test_unknown_paths_use_the_surface_shape(procs: Processes) -> None:
    stub = procs.stub()
    gateway = procs.gateway(upstream_toml("m", stub.url, ["m"]))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gateway.url}/v1/audio/transcriptions", json={}) as response:
            assert response.status == 404
            assert response.headers["content-type"].startswith("application/problem+json")
            body = await response.json()
            assert body["status"] == 404 and body["error"]["code"] == "not-found"
            assert "/v1/audio/transcriptions" in body["detail"]
        async with http.get(f"{gateway.url}/llm/v1/nothing") as response:
            assert response.status == 404
            body = await response.json()
            assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
            assert response.headers["request-id"]
        async with http.post(f"{gateway.url}/v1/chat/completions", json={"model": "m", "messages": []}) as response:
            assert response.status == 200  # the real routes still win over the mount
        async with http.get(f"{gateway.url}/v1/chat/completions") as response:
            assert response.status == 405
